//! The durable backend's write-ahead log: each batch appended as one record and made durable
//! with one `fdatasync`, replayed into the database after a crash, emptied at checkpoints.
//!
//! A record is its payload's length (4 bytes, little-endian), the CRC-32 of the payload
//! (4 bytes) and the payload. Reading stops at the first record that is cut short or does not
//! match its CRC (a write the crash interrupted): what follows is dropped. Nothing is
//! allocated from a length field beyond what the file holds.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The log file in the data directory.
pub const FILE_NAME: &str = "ring.wal";

pub(super) struct Wal {
    file: File,
    len: u64,
}

/// What [`Wal::open`] found.
pub(super) struct Recovered {
    /// The payloads of the complete records, in order.
    pub records: Vec<Vec<u8>>,
    /// Bytes after them that were dropped (a record cut short or corrupt).
    pub dropped: u64,
}

impl Wal {
    /// Opens (or creates) the log and reads its records.
    pub fn open(path: &Path) -> std::io::Result<(Wal, Recovered)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
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
        Ok((Wal { file, len: size }, Recovered { records, dropped }))
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
        self.file.seek(SeekFrom::Start(self.len))?;
        self.file.write_all(&record)?;
        self.file.sync_data()?;
        self.len += record.len() as u64;
        Ok(())
    }

    /// Empties the log (everything in it is durable in the database).
    pub fn reset(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.sync_data()?;
        self.len = 0;
        Ok(())
    }

    /// Bytes in the log.
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
        let path = dir.path().join(FILE_NAME);
        {
            let (mut wal, rec) = Wal::open(&path).unwrap();
            assert!(rec.records.is_empty());
            wal.append(b"one").unwrap();
            wal.append(b"").unwrap();
            wal.append(b"three").unwrap();
        }
        // A crash in the middle of a fourth record; then a length that claims 4 GiB.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2, 3, 4, b'x']).unwrap();
        drop(f);
        let (mut wal, rec) = Wal::open(&path).unwrap();
        assert_eq!(
            rec.records,
            vec![b"one".to_vec(), b"".to_vec(), b"three".to_vec()]
        );
        assert_eq!(rec.dropped, 9);
        wal.reset().unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
        drop(f);
        let (_, rec) = Wal::open(&path).unwrap();
        assert!(rec.records.is_empty());
        assert_eq!(rec.dropped, 8);
        // A record whose bytes changed is not taken.
        let _ = std::fs::remove_file(&path);
        let (mut wal, _) = Wal::open(&path).unwrap();
        wal.append(b"abc").unwrap();
        drop(wal);
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, rec) = Wal::open(&path).unwrap();
        assert!(rec.records.is_empty());
    }
}
