//! Spans counted by kind straight from an export's protobuf bytes, for the
//! counting receiver ([`super::Receiver::counting`]): no message decoded,
//! nothing allocated, the bytes of every field but the three levels that
//! lead to a span's kind skipped by their length.
//!
//! The path, as the OpenTelemetry protocol defines it:
//! `ExportTraceServiceRequest.resource_spans` (1) →
//! `ResourceSpans.scope_spans` (2) → `ScopeSpans.spans` (2) → `Span.kind`
//! (6, an enum). The framing of every field on that path is checked as
//! prost checks it: bytes that do not frame are refused, as decoding them
//! would be. The content of the fields skipped (a string's UTF-8, an
//! attribute's message) is not looked at.
//!
//! A gRPC export arrives through tonic as raw bytes ([`RawCodec`]), so that
//! tonic decodes nothing either.

use axum::body::Bytes;
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::SpanKind;

/// An export's spans, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Kinds {
    pub(super) server: u64,
    pub(super) client: u64,
    pub(super) other: u64,
}

impl Kinds {
    /// Counts a span of `kind`, the protocol's enum value: an unknown one
    /// counts as other, as prost reads it as unspecified.
    pub(super) fn add(&mut self, kind: i32) {
        match SpanKind::try_from(kind) {
            Ok(SpanKind::Server) => self.server += 1,
            Ok(SpanKind::Client) => self.client += 1,
            _ => self.other += 1,
        }
    }
}

/// The spans of the `ExportTraceServiceRequest` in `request`, by kind;
/// `None` if its bytes do not frame as one.
pub(super) fn count(request: &[u8]) -> Option<Kinds> {
    let mut kinds = Kinds::default();
    each(request, |tag, field| match (tag, field) {
        (1, Field::Bytes(resource_spans)) => {
            each(resource_spans, |tag, field| match (tag, field) {
                (2, Field::Bytes(scope_spans)) => {
                    each(scope_spans, |tag, field| match (tag, field) {
                        (2, Field::Bytes(span)) => {
                            kinds.add(kind(span)?);
                            Some(())
                        }
                        (2, _) => None,
                        _ => Some(()),
                    })
                }
                (2, _) => None,
                _ => Some(()),
            })
        }
        (1, _) => None,
        _ => Some(()),
    })?;
    Some(kinds)
}

/// A span's kind: the last value of field 6, as prost keeps the last of a
/// repeated scalar; 0 (unspecified) if it has none.
fn kind(span: &[u8]) -> Option<i32> {
    let mut kind = 0;
    each(span, |tag, field| match (tag, field) {
        // An enum is an `int32`: a varint, truncated as prost truncates it.
        (6, Field::Varint(value)) => {
            kind = value as i32;
            Some(())
        }
        (6, _) => None,
        _ => Some(()),
    })?;
    Some(kind)
}

/// A field's value, as its wire type frames it.
#[derive(Clone, Copy, Debug)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A `fixed32` or `fixed64`: its value is of no concern here.
    Fixed,
}

/// Calls `visit` with each field of the message in `bytes`, in order, and
/// stops at the first `None` it returns; `None` also if a key, a varint or
/// a length runs past the end, or the wire type is a group's (which
/// OpenTelemetry's messages never use) or none at all.
fn each<'a>(
    mut bytes: &'a [u8],
    mut visit: impl FnMut(u32, Field<'a>) -> Option<()>,
) -> Option<()> {
    while !bytes.is_empty() {
        // A key is a `u32` (prost's limit): the number, then the type.
        let key = u32::try_from(varint(&mut bytes)?).ok()?;
        let tag = Some(key >> 3).filter(|tag| *tag != 0)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(&mut bytes)?),
            1 => Field::Fixed.skipping(&mut bytes, 8)?,
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).ok()?;
                let (content, rest) = bytes.split_at_checked(len)?;
                bytes = rest;
                Field::Bytes(content)
            }
            5 => Field::Fixed.skipping(&mut bytes, 4)?,
            _ => return None,
        };
        visit(tag, field)?;
    }
    Some(())
}

impl Field<'_> {
    /// `self`, once `len` bytes are skipped.
    fn skipping(self, bytes: &mut &[u8], len: usize) -> Option<Self> {
        *bytes = bytes.get(len..)?;
        Some(self)
    }
}

/// A varint of at most ten bytes, taken off the front of `bytes`; the
/// tenth may hold one bit only (the 64th), as prost requires.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0_u64;
    for (index, &byte) in bytes.iter().take(10).enumerate() {
        if index == 9 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            *bytes = &bytes[index + 1..];
            return Some(value);
        }
    }
    None
}

/// A tonic codec that hands a gRPC message over as its bytes, and sends
/// bytes as they are: a service that reads the message itself.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
