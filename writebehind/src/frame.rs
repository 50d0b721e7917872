//! The on-disk format shared by journal segments and spill files: a small
//! file header, then framed records.
//!
//! ```text
//! file   := header(16) record* end
//! header := "LDWB" kind:u8 version:u8 0:u16 use:u32 0:u32
//! record := len:u32 crc:u32 body            (len = body's length)
//! body   := use:u32 generation:u64 payload  (payload = postcard of (key, value))
//! end    := 0:u32                           (or the file's end)
//! ```
//!
//! Every integer is little-endian; `crc` is the CRC-32 of the body. A
//! record is written body first and length last, so a length that is not
//! zero is the record's commit. `use` counts the times a journal segment
//! was recycled: a record left from an earlier use ends the file, it is
//! never read as current. A record whose checksum or length does not hold
//! (torn by a crash of the machine, or damaged) is reported with its
//! offset and skipped; the rest of the file is still read.

use serde::Serialize;

/// Bytes of the file header; records start here.
pub(crate) const HEADER: usize = 16;

const MAGIC: &[u8; 4] = b"LDWB";

/// The format this build writes and reads.
const VERSION: u8 = 1;

/// `len` and `crc`.
const RECORD_HEAD: usize = 8;

/// `use` and `generation`.
const BODY_HEAD: usize = 12;

/// The zero length that ends the records.
const END: usize = 4;

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A journal segment: one update a record, written through a mapping.
    Segment = b'J',
    /// A spill file: one merged value a key and batch, written once.
    Spill = b'S',
}

/// Writes a file header for `kind` and `use_` into `buf`.
pub(crate) fn write_header(buf: &mut [u8], kind: Kind, use_: u32) {
    buf[..4].copy_from_slice(MAGIC);
    buf[4] = kind as u8;
    buf[5] = VERSION;
    buf[6..8].fill(0);
    buf[8..12].copy_from_slice(&use_.to_le_bytes());
    buf[12..HEADER].fill(0);
}

/// The `use` of a file of `kind`, or why the header is not one.
pub(crate) fn read_header(bytes: &[u8], kind: Kind) -> Result<u32, String> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Err("not a write-behind file".to_owned());
    }
    if bytes[4] != kind as u8 {
        return Err(format!("a file of kind {:?}, not {kind:?}", bytes[4]));
    }
    if bytes[5] != VERSION {
        return Err(format!(
            "format version {}, this build reads {VERSION}",
            bytes[5]
        ));
    }
    Ok(u32_at(bytes, 8))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Frames `payload` at the start of `buf`, leaving a zero length after it,
/// and returns the bytes taken; `None` (with the length at `buf`'s start
/// untouched) if it does not fit. `buf` must start with a zero length.
pub(crate) fn encode<T: Serialize + ?Sized>(
    buf: &mut [u8],
    use_: u32,
    generation: u64,
    payload: &T,
) -> Option<usize> {
    let room = buf.len().checked_sub(RECORD_HEAD + BODY_HEAD + END)?;
    let body = &mut buf[RECORD_HEAD..];
    let used = postcard::to_slice(payload, &mut body[BODY_HEAD..BODY_HEAD + room])
        .ok()?
        .len();
    let len = BODY_HEAD + used;
    body[..4].copy_from_slice(&use_.to_le_bytes());
    body[4..BODY_HEAD].copy_from_slice(&generation.to_le_bytes());
    body[len..len + END].fill(0);
    let crc = crc32fast::hash(&body[..len]);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    // The length last: until it is written the record does not exist.
    buf[..4].copy_from_slice(&u32::try_from(len).ok()?.to_le_bytes());
    Some(RECORD_HEAD + len)
}

/// Appends a framed record of `payload` to `out` (a spill file being
/// built; the caller ends it with [`end`]).
pub(crate) fn push<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    use_: u32,
    generation: u64,
    payload: &T,
) -> Result<(), postcard::Error> {
    let payload = postcard::to_allocvec(payload)?;
    let start = out.len();
    out.resize(start + RECORD_HEAD + BODY_HEAD + payload.len() + END, 0);
    let written = encode(&mut out[start..], use_, generation, &Raw(&payload));
    debug_assert_eq!(written, Some(RECORD_HEAD + BODY_HEAD + payload.len()));
    out.truncate(out.len() - END);
    Ok(())
}

/// Appends the zero length that ends the records.
pub(crate) fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0; END]);
}

/// Bytes already in postcard's form, written as they are.
struct Raw<'a>(&'a [u8]);

impl Serialize for Raw<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // postcard writes a tuple's fields one after the other with no
        // framing of its own: the bytes of one field are the bytes alone.
        use serde::ser::SerializeTuple;
        let mut tuple = serializer.serialize_tuple(self.0.len())?;
        for byte in self.0 {
            tuple.serialize_element(byte)?;
        }
        tuple.end()
    }
}

/// A record read back.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    /// Where its frame starts in the file.
    pub(crate) offset: usize,
    /// The batch generation it belongs to.
    pub(crate) generation: u64,
    /// Its payload, in postcard's form.
    pub(crate) payload: &'a [u8],
}

/// A record that could not be read: where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Torn {
    /// Where its frame starts in the file.
    pub(crate) offset: usize,
    /// What did not hold.
    pub(crate) why: &'static str,
}

/// Reads the records after the header of a file whose header says `use_`:
/// the good ones, and the torn ones skipped.
pub(crate) fn read(bytes: &[u8], use_: u32) -> (Vec<Record<'_>>, Vec<Torn>) {
    let (mut records, mut torn) = (Vec::new(), Vec::new());
    let mut offset = HEADER;
    while offset + RECORD_HEAD <= bytes.len() {
        let len = u32_at(bytes, offset) as usize;
        if len == 0 {
            break;
        }
        let body_at = offset + RECORD_HEAD;
        if len < BODY_HEAD || body_at + len > bytes.len() {
            // Nothing after it can be found without its length.
            torn.push(Torn {
                offset,
                why: "its length runs past the file",
            });
            break;
        }
        let body = &bytes[body_at..body_at + len];
        let next = body_at + len;
        if crc32fast::hash(body) != u32_at(bytes, offset + 4) {
            torn.push(Torn {
                offset,
                why: "its checksum does not match",
            });
            offset = next;
            continue;
        }
        if u32_at(body, 0) != use_ {
            // Left from an earlier use of a recycled segment: the end.
            break;
        }
        records.push(Record {
            offset,
            generation: u64_at(body, 4),
            payload: &body[BODY_HEAD..],
        });
        offset = next;
    }
    (records, torn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(records: &[(u64, (&str, u64))]) -> Vec<u8> {
        let mut out = vec![0; HEADER];
        write_header(&mut out, Kind::Spill, 7);
        for (generation, payload) in records {
            push(&mut out, 7, *generation, payload).expect("encode");
        }
        end(&mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> (Vec<(u64, String, u64)>, Vec<Torn>) {
        let (records, torn) = read(bytes, read_header(bytes, Kind::Spill).expect("header"));
        let records = records
            .iter()
            .map(|r| {
                let (key, value): (String, u64) = postcard::from_bytes(r.payload).expect("decode");
                (r.generation, key, value)
            })
            .collect();
        (records, torn)
    }

    #[test]
    fn records_pushed_and_encoded_in_place_read_back_the_same() {
        let bytes = file(&[(1, ("abc", 3)), (2, ("xyz", 1))]);
        let mut mapped = vec![0; 128];
        write_header(&mut mapped, Kind::Spill, 7);
        let mut at = HEADER;
        for (generation, payload) in [(1, ("abc", 3_u64)), (2, ("xyz", 1))] {
            at += encode(&mut mapped[at..], 7, generation, &payload).expect("fits");
        }
        assert_eq!(&mapped[..bytes.len()], &bytes[..]);
        let (records, torn) = decoded(&bytes);
        assert_eq!(
            records,
            [(1, "abc".to_owned(), 3), (2, "xyz".to_owned(), 1)]
        );
        assert!(torn.is_empty());
    }

    #[test]
    fn a_record_that_does_not_fit_leaves_the_end_where_it_was() {
        let mut buf = vec![0; 30];
        assert_eq!(
            encode(&mut buf, 1, 1, &("a-long-key-that-needs-room", 1_u64)),
            None
        );
        assert_eq!(u32_at(&buf, 0), 0);
    }

    #[test]
    fn a_bad_checksum_is_skipped_and_the_rest_is_read() {
        let mut bytes = file(&[(1, ("abc", 3)), (1, ("def", 4)), (2, ("xyz", 1))]);
        // Damage the first record's payload.
        bytes[HEADER + RECORD_HEAD + BODY_HEAD + 1] ^= 0xff;
        let (records, torn) = decoded(&bytes);
        assert_eq!(
            torn,
            [Torn {
                offset: HEADER,
                why: "its checksum does not match"
            }]
        );
        assert_eq!(
            records,
            [(1, "def".to_owned(), 4), (2, "xyz".to_owned(), 1)]
        );
    }

    #[test]
    fn a_file_cut_mid_record_keeps_the_records_before_the_cut() {
        let bytes = file(&[(1, ("abc", 3)), (1, ("def", 4))]);
        let cut = &bytes[..bytes.len() - 6];
        let (records, torn) = decoded(cut);
        assert_eq!(records, [(1, "abc".to_owned(), 3)]);
        assert_eq!(torn.len(), 1, "{torn:?}");
        assert_eq!(torn[0].why, "its length runs past the file");
    }

    #[test]
    fn records_of_an_earlier_use_end_the_file() {
        let old = file(&[(1, ("abc", 3)), (1, ("def", 4))]);
        let mut bytes = old.clone();
        // Recycled: a new use, one record written over the first.
        write_header(&mut bytes, Kind::Spill, 8);
        bytes[HEADER..HEADER + 4].fill(0);
        let taken = encode(&mut bytes[HEADER..], 8, 5, &("new", 1_u64)).expect("fits");
        // The end marker it leaves hides what is left of the old records;
        // and without it, their `use` would.
        let (records, torn) = read(&bytes, 8);
        assert_eq!(records.len(), 1);
        assert!(torn.is_empty());
        bytes[HEADER + taken..HEADER + taken + END]
            .copy_from_slice(&old[HEADER + taken..HEADER + taken + END]);
        let (records, _) = read(&bytes, 8);
        assert_eq!(records.len(), 1, "the old record is not read as current");
    }
}
