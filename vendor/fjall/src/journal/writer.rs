// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{serialize_marker_item, Entry};
use crate::{
    batch::item::Item as BatchItem, file::fsync_directory, journal::recovery::JournalId,
    keyspace::InternalKeyspaceId,
};
use lsm_tree::{CompressionType, SeqNo, ValueType};
use std::{
    fs::{File, OpenOptions},
    hash::Hasher,
    io::{BufWriter, Seek, Write},
    path::{Path, PathBuf},
};

// TODO: this should be a database configuration
pub const PRE_ALLOCATED_BYTES: u64 = 64 * 1_024 * 1_024;

pub const JOURNAL_BUFFER_BYTES: usize = 8 * 1_024;

/// Extension of a journal file being zero-filled ahead of its use (`{id}.jnl.zeroing`).
const ZEROING: &str = "zeroing";
/// Extension of a journal file zero-filled and synced, ready for a rotation (`{id}.jnl.zeroed`).
const ZEROED: &str = "zeroed";
/// Bytes a journal writer writes before it starts preparing the next journal's file.
pub const PREPARE_AFTER_BYTES: u64 = PRE_ALLOCATED_BYTES / 8;
/// Bytes of zeros written between two syncs while preparing a journal file, so that its
/// writeback comes in small pieces instead of one burst (monoseq patch).
const PREPARE_SYNC_BYTES: usize = 1_024 * 1_024;
/// Pause between two synced pieces of a journal file being prepared (monoseq patch): written
/// at the disk's full speed, the 64 MiB went out in about 0.3 s, and every other file's sync
/// (the PLog segments', the high-water marks') queued behind its pieces for tens of ms. Paced,
/// a file takes at least 63 pauses (1.26 s), well within the journal's 24 MiB of batches
/// between the start of its preparation and the rotation that uses it.
const PREPARE_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// `{id}.jnl.{extension}` beside journal file `journal` (`{id}.jnl`). Not a `.jnl` file:
/// recovery passes it by.
fn prepared_path(journal: &Path, extension: &str) -> PathBuf {
    journal.with_extension(format!("jnl.{extension}"))
}

/// The folder of journal file `path` (`{id}.jnl`) and the path of the journal after it.
fn next_journal_path(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let folder = path.parent()?.to_path_buf();
    let id = path
        .file_name()?
        .to_str()?
        .strip_suffix(".jnl")?
        .parse::<JournalId>()
        .ok()?;
    let next = folder.join(format!("{}.jnl", id + 1));
    Some((folder, next))
}

/// Writes `PRE_ALLOCATED_BYTES` of zeros to `{journal}.zeroing`, syncing and pausing as it
/// goes, then renames it `{journal}.zeroed`: a file under that name is whole and on disk.
fn write_zeroed(journal: &Path) -> std::io::Result<()> {
    let partial = prepared_path(journal, ZEROING);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&partial)?;
    let zeros = vec![0u8; PREPARE_SYNC_BYTES];
    let mut written = 0u64;
    while written < PRE_ALLOCATED_BYTES {
        if written > 0 {
            // Between two pieces only: the whole file is renamed at once after the last.
            std::thread::sleep(PREPARE_PAUSE);
        }
        let n = (PRE_ALLOCATED_BYTES - written).min(PREPARE_SYNC_BYTES as u64) as usize;
        file.write_all(&zeros[..n])?;
        file.sync_data()?;
        written += n as u64;
    }
    drop(file);
    std::fs::rename(&partial, prepared_path(journal, ZEROED))
}

pub struct Writer {
    pub(crate) path: PathBuf,
    file: BufWriter<File>,
    buf: Vec<u8>,
    is_buffer_dirty: bool,

    /// The thread preparing the next journal's file, if one was started for this journal.
    preparing: Option<std::thread::JoinHandle<()>>,
    /// Bytes of batches this writer wrote (since it opened the file).
    written: u64,

    compression: CompressionType,
    compression_threshold: usize,
}

/// The persist mode allows setting the durability guarantee of previous writes
#[derive(Copy, Clone, Debug, Eq, PartialEq)]
pub enum PersistMode {
    /// Flushes data to OS buffers. This allows the OS to write out data in case of an
    /// application crash.
    ///
    /// When this function returns, data is **not** guaranteed to be persisted in case
    /// of a power loss event or OS crash.
    Buffer,

    /// Flushes data using `fdatasync`.
    ///
    /// Use if you know that `fdatasync` is sufficient for your file system and/or operating system.
    SyncData,

    /// Flushes data + metadata using `fsync`.
    SyncAll,
}

impl Writer {
    pub fn set_compression(&mut self, comp: CompressionType, threshold: usize) {
        self.compression = comp;
        self.compression_threshold = threshold;
    }

    pub fn pos(&mut self) -> crate::Result<u64> {
        self.file.stream_position().map_err(Into::into)
    }

    pub fn len(&self) -> crate::Result<u64> {
        Ok(self.file.get_ref().metadata()?.len())
    }

    pub fn rotate(&mut self) -> crate::Result<(PathBuf, PathBuf)> {
        // `fdatasync`: the bytes and the length recovery reads. A full `fsync` would also
        // commit the file's times, a commit of the file system's journal under the journal's
        // lock, which on ext4 waits for every other file's pending data.
        self.persist(PersistMode::SyncData)?;

        log::debug!(
            "Sealing active journal at {}, len={}B",
            self.path.display(),
            self.path
                .metadata()
                .inspect_err(|e| {
                    log::error!(
                        "Failed to get file metadata of journal file at {}: {e:?}",
                        self.path.display()
                    );
                })?
                .len(),
        );

        let prev_path = self.path.clone();

        let folder = self
            .path
            .parent()
            .expect("should have parent")
            .to_path_buf();

        let Some(basename) = self
            .path
            .file_name()
            .expect("should be valid file name")
            .to_str()
            .expect("should be valid utf-8")
            .strip_suffix(".jnl")
        else {
            log::error!("Invalid journal file name: {}", self.path.display());
            return Err(crate::Error::JournalRecovery(
                crate::JournalRecoveryError::InvalidFileName,
            ));
        };

        let journal_id = basename.parse::<JournalId>().map_err(|_| {
            log::error!("Invalid journal file name: {}", self.path.display());
            crate::Error::JournalRecovery(crate::JournalRecoveryError::InvalidFileName)
        })?;

        let new_path = folder.join(format!("{}.jnl", journal_id + 1));
        log::debug!("Rotating active journal to {}", new_path.display());

        let comp = self.compression;
        let compt = self.compression_threshold;
        *self = match Self::take_prepared(&new_path)? {
            Some(writer) => writer,
            None => Self::create_new(new_path.clone())?,
        };
        self.set_compression(comp, compt);

        // IMPORTANT: fsync folder on Unix
        fsync_directory(&folder)?;

        self.remove_stale_prepared();

        Ok((prev_path, new_path))
    }

    /// The journal file `path` from a prepared one (`prepared_path(path, ZEROED)`, written
    /// whole with zeros and synced by [`Writer::prepare_next`]), renamed into place and opened
    /// at its start; `None` when none is ready (the caller creates the file as before).
    ///
    /// A journal whose bytes are already on disk takes a write and an `fdatasync` without
    /// allocating a block: the sync writes the data alone, while one that allocates (in the
    /// sparse file `set_len` leaves) commits the file system's journal, which on ext4 waits for
    /// every other file's pending data, a table being flushed or compacted included. The file
    /// holds the same bytes as the sparse one (zeros), so recovery reads it alike.
    fn take_prepared(path: &Path) -> crate::Result<Option<Self>> {
        let prepared = prepared_path(path, ZEROED);
        match std::fs::metadata(&prepared) {
            Ok(meta) if meta.is_file() && meta.len() == PRE_ALLOCATED_BYTES => {}
            _ => return Ok(None),
        }
        std::fs::rename(&prepared, path).inspect_err(|e| {
            log::error!(
                "Failed to rename prepared journal file {} to {}: {e:?}",
                prepared.display(),
                path.display(),
            );
        })?;
        let file = OpenOptions::new().write(true).open(path).inspect_err(|e| {
            log::error!("Failed to open journal file at {}: {e:?}", path.display());
        })?;
        log::debug!("Rotated into prepared journal {}", path.display());
        Ok(Some(Self {
            path: path.to_path_buf(),
            file: BufWriter::new(file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            preparing: None,
            written: 0,
            compression: CompressionType::None,
            compression_threshold: 0,
        }))
    }

    /// Removes the prepared files no rotation will use: those of other journals, and any left
    /// half written (a crash while preparing).
    pub(crate) fn remove_stale_prepared(&self) {
        let Some((folder, next)) = next_journal_path(&self.path) else {
            return;
        };
        let ready = prepared_path(&next, ZEROED);
        let Ok(entries) = std::fs::read_dir(&folder) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let stale = path
                .extension()
                .is_some_and(|ext| ext == ZEROING || (ext == ZEROED && path != ready));
            if stale {
                if let Err(e) = std::fs::remove_file(&path) {
                    log::warn!("Failed to remove prepared journal {}: {e:?}", path.display());
                }
            }
        }
    }

    /// Counts `bytes` more written by a batch; past [`PREPARE_AFTER_BYTES`] starts preparing
    /// the next journal's file.
    fn count_written(&mut self, bytes: usize) {
        self.written += bytes as u64;
        if self.written > PREPARE_AFTER_BYTES {
            self.prepare_next();
        }
    }

    /// Starts preparing the next journal's file on a thread of its own, unless it is ready or
    /// one was started for this journal. Called by the batch that takes this writer past
    /// [`PREPARE_AFTER_BYTES`]: a database that writes little (a test's, a quiet one's) never
    /// writes the zeros. A failure only means the next rotation creates a sparse file.
    fn prepare_next(&mut self) {
        if self.preparing.is_some() {
            return;
        }
        let Some((_, next)) = next_journal_path(&self.path) else {
            return;
        };
        let ready = prepared_path(&next, ZEROED);
        if ready.exists() {
            return;
        }
        self.remove_stale_prepared();
        let spawned = std::thread::Builder::new()
            .name("fjall:journal-prep".into())
            .spawn(move || {
                if let Err(e) = write_zeroed(&next) {
                    log::warn!(
                        "Failed to prepare journal file for {}: {e:?}; the next rotation \
                         creates a sparse one",
                        next.display(),
                    );
                }
            });
        match spawned {
            Ok(thread) => self.preparing = Some(thread),
            Err(e) => log::warn!("Failed to start the journal preparation thread: {e:?}"),
        }
    }

    pub fn create_new<P: Into<PathBuf>>(path: P) -> crate::Result<Self> {
        let path = path.into();

        let file = File::create_new(&path).inspect_err(|e| {
            log::error!("Failed to create journal file at {}: {e:?}", path.display());
        })?;

        file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
            log::error!(
                "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                path.display(),
            );
        })?;

        file.sync_all().inspect_err(|e| {
            log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
        })?;

        Ok(Self {
            path,
            file: BufWriter::new(file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            preparing: None,
            written: 0,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    pub fn from_file<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let path = path.as_ref();

        if !path.try_exists()? {
            let file = OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(path)
                .inspect_err(|e| {
                    log::error!("Failed to create journal file at {}: {e:?}", path.display());
                })?;

            file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
                log::error!(
                    "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                    path.display(),
                );
            })?;

            file.sync_all().inspect_err(|e| {
                log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
            })?;

            return Ok(Self {
                path: path.into(),
                file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
                buf: Vec::new(),
                is_buffer_dirty: false,
            preparing: None,
            written: 0,
                compression: CompressionType::None,
                compression_threshold: 0,
            });
        }

        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .inspect_err(|e| {
                log::error!("Failed to open journal file at {}: {e:?}", path.display());
            })?;

        Ok(Self {
            path: path.into(),
            file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            preparing: None,
            written: 0,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    /// Hands the buffered bytes to the OS and answers a second handle of the journal file to
    /// sync them with after the journal's lock is released (`None` for
    /// [`PersistMode::Buffer`], which needs no sync). A sync through the handle covers every
    /// byte handed over before it, whichever writer handed it: writers append while one
    /// syncs, instead of waiting for the disk behind the lock.
    pub(crate) fn prepare_persist(&mut self, mode: PersistMode) -> std::io::Result<Option<File>> {
        self.persist(PersistMode::Buffer)?;
        if mode == PersistMode::Buffer {
            return Ok(None);
        }
        self.file.get_ref().try_clone().map(Some).inspect_err(|e| {
            log::error!(
                "Failed to open a second handle of journal file at {}: {e:?}",
                self.path.display(),
            );
        })
    }

    /// Persists the journal file.
    pub(crate) fn persist(&mut self, mode: PersistMode) -> std::io::Result<()> {
        log::trace!(
            "Persisting journal at {} with mode={mode:?}",
            self.path.display(),
        );

        if self.is_buffer_dirty {
            self.file.flush().inspect_err(|e| {
                log::error!(
                    "Failed to flush journal IO buffers at {}: {e:?}",
                    self.path.display(),
                );
            })?;
            self.is_buffer_dirty = false;
        }

        match mode {
            PersistMode::SyncAll => self.file.get_mut().sync_all().inspect_err(|e| {
                log::error!(
                    "Failed to fsync journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::SyncData => self.file.get_mut().sync_data().inspect_err(|e| {
                log::error!(
                    "Failed to fsyncdata journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::Buffer => Ok(()),
        }
    }

    /// Syncs `file` (a handle [`Writer::prepare_persist`] answered) with `mode`.
    pub(crate) fn sync_handle(file: &File, mode: PersistMode) -> std::io::Result<()> {
        match mode {
            PersistMode::SyncAll => file.sync_all(),
            PersistMode::SyncData => file.sync_data(),
            PersistMode::Buffer => Ok(()),
        }
        .inspect_err(|e| log::error!("Failed to sync journal file: {e:?}"))
    }

    /// Writes a batch start marker to the journal
    fn write_start(&mut self, item_count: u32, seqno: SeqNo) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::Start { item_count, seqno }.encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    /// Writes a batch end marker to the journal
    fn write_end(&mut self, checksum: u64) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::End(checksum).encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    pub(crate) fn write_raw(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        key: &[u8],
        value: &[u8],
        value_type: ValueType,
        seqno: u64,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        serialize_marker_item(
            &mut self.buf,
            keyspace_id,
            key,
            value,
            value_type,
            if self.compression_threshold > 0 && value.len() >= self.compression_threshold {
                self.compression
            } else {
                CompressionType::None
            },
        )?;

        self.file.write_all(&self.buf)?;

        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        self.count_written(byte_count);

        Ok(byte_count)
    }

    pub(crate) fn write_clear(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        Entry::Clear { keyspace_id }.encode_into(&mut self.buf)?;
        self.file.write_all(&self.buf)?;
        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }

    pub fn write_batch<'a>(
        &mut self,
        items: impl Iterator<Item = &'a BatchItem>,
        batch_size: usize,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        if batch_size == 0 {
            return Ok(0);
        }

        self.is_buffer_dirty = true;

        self.buf.clear();

        // NOTE: entries.len() is surely never > u32::MAX
        #[expect(clippy::cast_possible_truncation)]
        let item_count = batch_size as u32;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        byte_count += self.write_start(item_count, seqno)?;
        self.buf.clear();

        for item in items {
            debug_assert!(self.buf.is_empty());

            serialize_marker_item(
                &mut self.buf,
                item.keyspace.id,
                &item.key,
                &item.value,
                item.value_type,
                if self.compression_threshold > 0 && item.value.len() >= self.compression_threshold
                {
                    self.compression
                } else {
                    CompressionType::None
                },
            )?;

            self.file.write_all(&self.buf)?;

            hasher.update(&self.buf);
            byte_count += self.buf.len();

            self.buf.clear();
        }

        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        self.count_written(byte_count);

        Ok(byte_count)
    }
}
