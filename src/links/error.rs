//! How the example's failures answer: storage errors as API errors, and the
//! one "no such link" answer every route gives.

use super::validate;
use crate::error::ApiError;
use crate::storage::health::RETRY_AFTER_SECS;
use crate::storage::StorageError;

impl From<StorageError> for ApiError {
    fn from(error: StorageError) -> ApiError {
        match error {
            StorageError::Conflict => ApiError::Conflict("code is already taken".to_owned()),
            StorageError::Cancelled => ApiError::Cancelled,
            StorageError::Busy => ApiError::RetryLater {
                message: "the service is busy; retry later".to_owned(),
                retry_after_secs: RETRY_AFTER_SECS,
            },
            StorageError::Unavailable(_)
            | StorageError::Unconfirmed(_)
            | StorageError::Down
            | StorageError::Closed => ApiError::RetryLater {
                message: "the database is unavailable; retry later".to_owned(),
                retry_after_secs: RETRY_AFTER_SECS,
            },
            other => ApiError::Internal(Box::new(other)),
        }
    }
}

/// 503 for a link whose creation the database did not confirm: it may
/// exist, and `GET /api/links/{code}` says.
pub(crate) fn unconfirmed(code: &str) -> ApiError {
    let location = format!("/api/links/{code}");
    ApiError::Unconfirmed {
        message: format!(
            "the database did not confirm the link '{code}'; it may have been created: \
             GET {location} tells, before you create it again"
        ),
        location,
        retry_after_secs: RETRY_AFTER_SECS,
    }
}

/// 404 for `code`, echoing it only when it could be a code.
pub(crate) fn not_found(code: &str) -> ApiError {
    // Echo the code only when it could be one: a 20 KB path gets a short answer.
    if validate::code(code).is_ok() {
        ApiError::NotFound(format!("no link with code '{code}'"))
    } else {
        ApiError::NotFound("no link with that code".to_owned())
    }
}
