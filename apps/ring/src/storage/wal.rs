//! The durable backend's write-ahead log: a sequence of numbered segment files; each batch is
//! appended to the newest segment as one record and made durable with one `fdatasync`.
//!
//! A record is its payload's length (4 bytes, little-endian), the CRC-32 of the payload
//! (4 bytes) and the payload. Reading stops at the first record that is cut short or does not
//! match its CRC (a write the crash interrupted): what follows is dropped. Nothing is
//! allocated from a length field beyond what the file holds.
//!
//! Segment `n` is the file `ring.wal.n`; a checkpoint seals the newest segment (the writer
//! goes on in segment `n + 1`) and deletes it once the database holds its changes. The single
//! file `ring.wal` of earlier versions is read as segment 0.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The prefix of segment files in the data directory (`ring.wal.1`, `ring.wal.2`, …).
pub const FILE_NAME: &str = "ring.wal";

/// The path of segment `seq` in `dir`.
pub fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    if seq == 0 {
        dir.join(FILE_NAME)
    } else {
        dir.join(format!("{FILE_NAME}.{seq}"))
    }
}

/// The segments in `dir`, oldest first.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let seq = if name == FILE_NAME {
            Some(0)
        } else {
            name.strip_prefix(FILE_NAME)
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|&n| n > 0)
        };
        if let Some(seq) = seq {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Makes the directory's entries (a created or deleted segment) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What [`read`] found in a segment.
pub(super) struct Recovered {
    /// The payloads of the complete records, in order.
    pub records: Vec<Vec<u8>>,
    /// Bytes after them that were dropped (a record cut short or corrupt).
    pub dropped: u64,
}

/// Reads a segment's records.
pub(super) fn read(path: &Path) -> std::io::Result<Recovered> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let mut bytes = Vec::with_capacity(size as usize);
    file.read_to_end(&mut bytes)?;
    let mut records = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= 8 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap_or([0; 4]));
        let Some(payload) = bytes.get(at + 8..at + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        records.push(payload.to_vec());
        at += 8 + len;
    }
    let dropped = bytes.len() as u64 - at as u64;
    Ok(Recovered { records, dropped })
}

/// The segment being written.
pub(super) struct Wal {
    dir: PathBuf,
    seq: u64,
    file: File,
    len: u64,
}

impl Wal {
    /// Creates segment `seq` in `dir` (empty) and makes its directory entry durable.
    pub fn create(dir: &Path, seq: u64) -> std::io::Result<Wal> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(segment_path(dir, seq))?;
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            seq,
            file,
            len: 0,
        })
    }

    /// Appends one record and waits until it is on disk.
    pub fn append(&mut self, payload: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(payload.len()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "log record over 4 GiB")
        })?;
        let mut record = Vec::with_capacity(8 + payload.len());
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        record.extend_from_slice(payload);
        if let Err(e) = self
            .file
            .write_all(&record)
            .and_then(|()| self.file.sync_data())
        {
            // Whatever part of the record reached the file ends the segment for a reader
            // (a short record); the next append goes after it all the same, so cut it off.
            let _ = self.file.set_len(self.len);
            let _ = self.file.seek(SeekFrom::Start(self.len));
            return Err(e);
        }
        self.len += record.len() as u64;
        Ok(())
    }

    /// Goes on in the next segment; returns the number of the one it leaves (sealed).
    pub fn rotate(&mut self) -> std::io::Result<u64> {
        let next = Wal::create(&self.dir, self.seq + 1)?;
        let sealed = self.seq;
        *self = next;
        Ok(sealed)
    }

    /// This segment's number.
    #[cfg(test)]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes in this segment.
    pub fn len(&self) -> u64 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_up_to_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_path(dir.path(), 1);
        {
            let mut wal = Wal::create(dir.path(), 1).unwrap();
            assert!(read(&path).unwrap().records.is_empty());
            wal.append(b"one").unwrap();
            wal.append(b"").unwrap();
            wal.append(b"three").unwrap();
            assert_eq!(wal.len(), 3 * 8 + 8);
        }
        // A crash in the middle of a fourth record; then a length that claims 4 GiB.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2, 3, 4, b'x']).unwrap();
        drop(f);
        let rec = read(&path).unwrap();
        assert_eq!(
            rec.records,
            vec![b"one".to_vec(), b"".to_vec(), b"three".to_vec()]
        );
        assert_eq!(rec.dropped, 9);
        Wal::create(dir.path(), 1).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
        drop(f);
        let rec = read(&path).unwrap();
        assert!(rec.records.is_empty());
        assert_eq!(rec.dropped, 8);
        // A record whose bytes changed is not taken.
        let mut wal = Wal::create(dir.path(), 1).unwrap();
        wal.append(b"abc").unwrap();
        drop(wal);
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read(&path).unwrap().records.is_empty());
    }

    #[test]
    fn segments_are_listed_oldest_first_and_rotation_moves_on() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), b"").unwrap();
        std::fs::write(dir.path().join("ring.wal.x"), b"").unwrap();
        std::fs::write(dir.path().join("ring.redb"), b"").unwrap();
        let mut wal = Wal::create(dir.path(), 9).unwrap();
        wal.append(b"in nine").unwrap();
        assert_eq!(wal.rotate().unwrap(), 9);
        assert_eq!((wal.seq(), wal.len()), (10, 0));
        wal.append(b"in ten").unwrap();
        let found: Vec<u64> = segments(dir.path())
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(found, vec![0, 9, 10]);
        assert_eq!(
            read(&segment_path(dir.path(), 9)).unwrap().records,
            vec![b"in nine".to_vec()]
        );
    }
}
