//! The sampling decision, taken as the SDK's standard samplers take it,
//! without their machinery.
//!
//! `OTEL_TRACES_SAMPLER` and its argument name one of the SDK's
//! `Sampler`s, read here as `opentelemetry_sdk::trace::Config` reads them
//! (which still warns of a value it does not know). Asked through
//! `ShouldSample`, the SDK's sampler builds a `SamplingResult` each time —
//! a vector of attributes, a copy of the parent's trace state — and a
//! parent-based one asks its root sampler through a second virtual call:
//! about 250 instructions at every request, sampled or not. Here the
//! decision is a comparison or two, and the caller copies the trace state
//! only for a request sampled. The tests hold every variant to the SDK's
//! own answers.

use opentelemetry::trace::{TraceContextExt, TraceId};
use opentelemetry::Context;

/// One of the SDK's standard samplers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Sampling {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio`: the trace ids below a bound.
    Ratio(Ratio),
    /// `parentbased_*`: the parent's decision, or the root's for a span
    /// without one.
    ParentBased(Root),
}

/// A parent-based sampler's root sampler.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(Ratio),
}

/// A ratio, as the SDK applies it to a trace id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Ratio {
    /// 1 or more: every trace.
    All,
    /// The traces whose id's low 63 bits are below this.
    Below(u64),
}

impl Ratio {
    fn new(ratio: f64) -> Ratio {
        if ratio >= 1.0 {
            Ratio::All
        } else {
            // As the SDK computes it: a negative ratio (or not a number)
            // samples nothing.
            Ratio::Below((ratio.max(0.0) * (1u64 << 63) as f64) as u64)
        }
    }

    fn samples(self, trace_id: TraceId) -> bool {
        match self {
            Ratio::All => true,
            Ratio::Below(bound) => {
                let low = u128::from_be_bytes(trace_id.to_bytes()) as u64;
                low >> 1 < bound
            }
        }
    }
}

impl Sampling {
    /// The sampler the standard variables name.
    pub(super) fn from_env() -> Sampling {
        let sampler = std::env::var("OTEL_TRACES_SAMPLER").ok();
        let argument = std::env::var("OTEL_TRACES_SAMPLER_ARG").ok();
        Sampling::from_vars(sampler.as_deref(), argument.as_deref())
    }

    /// The sampler `sampler` names with `argument`, as the SDK's
    /// configuration reads them: a ratio that is missing or no number is 1;
    /// a sampler it does not implement or know, `parentbased_always_on`.
    pub(super) fn from_vars(sampler: Option<&str>, argument: Option<&str>) -> Sampling {
        let ratio = || Ratio::new(argument.and_then(|a| a.parse::<f64>().ok()).unwrap_or(1.0));
        match sampler {
            Some("always_on") => Sampling::AlwaysOn,
            Some("always_off") => Sampling::AlwaysOff,
            Some("traceidratio") => Sampling::Ratio(ratio()),
            Some("parentbased_always_off") => Sampling::ParentBased(Root::AlwaysOff),
            Some("parentbased_traceidratio") => Sampling::ParentBased(Root::Ratio(ratio())),
            // `parentbased_always_on`, the default, and the fallback for
            // any other value.
            _ => Sampling::ParentBased(Root::AlwaysOn),
        }
    }

    /// `true` if a span of `trace_id` whose parent is `parent`'s span (none
    /// if it has no active one) is recorded and sampled.
    pub(super) fn samples(self, parent: &Context, trace_id: TraceId) -> bool {
        match self {
            Sampling::AlwaysOn => true,
            Sampling::AlwaysOff => false,
            Sampling::Ratio(ratio) => ratio.samples(trace_id),
            // As the SDK's `Sampler::ParentBased`: a context with an active
            // span is a parent, valid or not.
            Sampling::ParentBased(_) if parent.has_active_span() => {
                parent.span().span_context().is_sampled()
            }
            Sampling::ParentBased(Root::AlwaysOn) => true,
            Sampling::ParentBased(Root::AlwaysOff) => false,
            Sampling::ParentBased(Root::Ratio(ratio)) => ratio.samples(trace_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};

    use super::*;

    /// The SDK's sampler for `sampler` and `argument`, as its
    /// configuration builds it from the variables.
    fn sdk(sampler: Option<&str>, argument: Option<&str>) -> Sampler {
        let ratio = || argument.and_then(|a| a.parse::<f64>().ok()).unwrap_or(1.0);
        match sampler {
            Some("always_on") => Sampler::AlwaysOn,
            Some("always_off") => Sampler::AlwaysOff,
            Some("traceidratio") => Sampler::TraceIdRatioBased(ratio()),
            Some("parentbased_always_off") => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            Some("parentbased_traceidratio") => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio())))
            }
            _ => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        }
    }

    fn parent(valid: bool, remote: bool, sampled: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let (trace, span) = if valid { (7, 9) } else { (0, 0) };
        let context = SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            flags,
            remote,
            TraceState::NONE,
        );
        Context::new().with_remote_span_context(context)
    }

    #[test]
    fn every_standard_sampler_decides_as_the_sdks() {
        let names = [
            None,
            Some("always_on"),
            Some("always_off"),
            Some("traceidratio"),
            Some("parentbased_always_on"),
            Some("parentbased_always_off"),
            Some("parentbased_traceidratio"),
            Some("parentbased_jaeger_remote"),
            Some("no such sampler"),
        ];
        let arguments = [
            None,
            Some("0"),
            Some("0.01"),
            Some("0.5"),
            Some("1"),
            Some("2"),
            Some("-1"),
            Some("NaN"),
            Some("one"),
        ];
        let mut parents = vec![Context::new()];
        for valid in [true, false] {
            for remote in [true, false] {
                for sampled in [true, false] {
                    parents.push(parent(valid, remote, sampled));
                }
            }
        }
        let mut state = 0x2545_f491_4f6c_dd1d_u128;
        let ids: Vec<TraceId> = (0..500)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                TraceId::from(state)
            })
            .collect();
        for name in names {
            for argument in arguments {
                let ours = Sampling::from_vars(name, argument);
                let theirs = sdk(name, argument);
                for parent in &parents {
                    for &id in &ids {
                        let decision = theirs
                            .should_sample(Some(parent), id, "GET /", &SpanKind::Server, &[], &[])
                            .decision;
                        assert_eq!(
                            ours.samples(parent, id),
                            decision == SamplingDecision::RecordAndSample,
                            "{name:?} {argument:?}, parent {:?}, trace {id}",
                            parent.span().span_context()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_ratio_samples_about_its_share() {
        let sampling = Sampling::from_vars(Some("traceidratio"), Some("0.25"));
        let mut state = 0x9e37_79b9_7f4a_7c15_u128;
        let sampled = (0..10_000)
            .filter(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                sampling.samples(&Context::new(), TraceId::from(state))
            })
            .count();
        assert!((2_200..2_800).contains(&sampled), "{sampled} of 10,000");
    }
}
