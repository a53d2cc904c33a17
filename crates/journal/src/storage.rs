//! The journal's window on the disk: a directory of segment files plus small side files.
//!
//! Everything the journal and the ledger store do to the disk goes through [`Storage`] and
//! [`SegmentFile`], so that tests can swap in [`crate::sim::SimStorage`], which loses unsynced
//! writes on a simulated crash and injects torn writes, bit flips, short writes, fsync errors
//! and ENOSPC. [`FsStorage`] is the real thing.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a segment opened for writing reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteMode {
    /// Open with `O_DIRECT` (bypass the page cache). Buffers, offsets and lengths are aligned.
    pub direct_io: bool,
    /// Open with `O_DSYNC`: each write is durable when it returns.
    pub dsync: bool,
}

pub trait SegmentFile: Send + Sync {
    /// Writes at `offset`; may write fewer bytes than asked (the caller loops).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Reads at `offset`; may read fewer bytes than asked (0 at the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Shrinks the file to `len` bytes, durably.
    fn truncate(&self, len: u64) -> io::Result<()>;
}

pub trait Storage: Send + Sync {
    /// Sequence numbers of the segment files present, ascending.
    fn list_segments(&self) -> io::Result<Vec<u64>>;
    /// Opens an existing segment for writing.
    fn open_segment_for_write(&self, seq: u64, mode: WriteMode)
        -> io::Result<Arc<dyn SegmentFile>>;
    /// Opens an existing segment for reading (through the page cache).
    fn open_segment_for_read(&self, seq: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Opens an existing segment for `O_DIRECT` reads (block-aligned buffers, offsets and
    /// lengths), or `None` where that is not available.
    fn open_segment_for_direct_read(&self, _seq: u64) -> io::Result<Option<Arc<dyn SegmentFile>>> {
        Ok(None)
    }
    /// Creates segment `seq` of `size` zero bytes, durably: data, size and name. Written zeros
    /// (not a hole, not fallocate) so that later fdatasyncs flush data only, no extent changes.
    fn create_segment(&self, seq: u64, size: u64) -> io::Result<()>;
    /// Renames the unused segment `from` to `to`, durably. Its old records carry `from`'s tag,
    /// so they read as the end of the log in segment `to`.
    fn recycle_segment(&self, from: u64, to: u64) -> io::Result<()>;
    /// Removes unused segments, made durable together (on a file system: one directory sync
    /// for all of them; a sync per file made a ledger's deletion, dozens of segments at once,
    /// dozens of file-system commits that appends' fdatasyncs queued behind).
    fn remove_segments(&self, seqs: &[u64]) -> io::Result<()>;
    /// Replaces the side file `name` with `data` atomically and durably.
    fn write_file_atomic(&self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Reads the side file `name`, if it exists.
    fn read_file(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    fn remove_file(&self, name: &str) -> io::Result<()>;
    /// Removes leftovers of interrupted creations.
    fn remove_temporaries(&self) -> io::Result<()>;
    /// Creates the reserve file of `size` bytes, allocated (not a hole), durably, replacing
    /// any: space held back so that a full disk can still record what frees it.
    fn create_reserve(&self, size: u64) -> io::Result<()>;
    /// The reserve file's size, if there is one.
    fn reserve_len(&self) -> io::Result<Option<u64>>;
    /// Removes the reserve file, durably, giving its space back (nothing if there is none).
    fn remove_reserve(&self) -> io::Result<()>;
    /// Bytes free for this storage's files, where known.
    fn free_bytes(&self) -> Option<u64>;
}

/// Writes all of `buf` at `offset`, looping over short writes.
pub fn write_all_at(file: &dyn SegmentFile, buf: &[u8], mut offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.write_at(&buf[done..], offset)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => {
                done += n;
                offset += n as u64;
            }
        }
    }
    Ok(())
}

const SEGMENT_SUFFIX: &str = ".journal";
const TEMP_PREFIX: &str = "tmp-";
/// The reserve file (see [`Storage::create_reserve`]).
pub const RESERVE_FILE: &str = "RESERVE";

/// Segment files and side files in one directory of a real file system.
pub struct FsStorage {
    dir: PathBuf,
}

impl FsStorage {
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(FsStorage { dir: dir.to_path_buf() })
    }

    fn segment_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}{SEGMENT_SUFFIX}"))
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

/// Replaces `dir/name` with `data` durably: a temporary file written and synced, renamed over
/// it, the directory synced. A crash leaves the old or the new file, never a mix.
pub fn write_file_atomic(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    let temp = dir.join(format!("{TEMP_PREFIX}{name}"));
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&temp)?;
    file.write_all(data)?;
    file.sync_all()?;
    fs::rename(&temp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// What [`fill`] writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fill {
    Zeros,
    /// Pseudo-random bytes, different in every block and every file: space that a compressing
    /// or deduplicating file system (ZFS, btrfs) must really allocate, as zeros it would not.
    Noise,
}

/// Writes `size` bytes of `content` to a new file and syncs it. With `O_DIRECT` where the file
/// system allows it: the bytes then bypass the page cache, and do not compete with the
/// journal's own writeback (measured: see ARCHITECTURE.md, "Preallocated segments").
fn fill(path: &Path, size: u64, content: Fill) -> io::Result<()> {
    const CHUNK: usize = 256 << 10;
    let open = |flags| {
        OpenOptions::new().write(true).create(true).truncate(true).custom_flags(flags).open(path)
    };
    let (file, direct) = match open(libc::O_DIRECT) {
        Ok(file) => (FsFile(file), true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (FsFile(open(0)?), false),
        Err(e) => return Err(e),
    };
    let mut chunk = crate::aligned::AlignedBuf::with_capacity(CHUNK);
    crate::record::Sink::extend_zeros(&mut chunk, CHUNK);
    let mut noise = (content == Fill::Noise).then(Noise::seeded);
    let mut written = 0u64;
    while written < size {
        if let Some(noise) = noise.as_mut() {
            noise.fill(chunk.as_capacity_slice_mut());
        }
        let n = (size - written).min(CHUNK as u64) as usize;
        let n = if direct { n.next_multiple_of(4096) } else { n };
        write_all_at(&file, &chunk.as_slice()[..n], written)?;
        written += n as u64;
    }
    if direct && written != size {
        file.0.set_len(size)?;
    }
    file.0.sync_all()
}

/// xorshift64*: fast, and random enough that no compressor or block dedup finds a pattern.
struct Noise(u64);

impl Noise {
    /// Seeded at random (the standard library's hash keys), so two stores' reserves differ too.
    fn seeded() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new().build_hasher().finish();
        Noise(seed | 1) // xorshift never leaves zero
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for word in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let bytes = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            word.copy_from_slice(&bytes[..word.len()]);
        }
    }
}

/// Allocates `size` bytes to a new file (`fallocate`: no data written, yet the blocks are the
/// file's, so its removal gives them back), falling back to writing noise where the file system
/// cannot allocate without writing (zeros would take no space where it compresses). Syncs it.
fn allocate(path: &Path, size: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    let len =
        libc::off_t::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain system call on a file descriptor this function owns.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(error);
        }
        drop(file);
        return fill(path, size, Fill::Noise);
    }
    file.sync_all()
}

/// Bytes available to unprivileged users on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a valid NUL-terminated string and `stat` is a writable statvfs that
    // the call fills in; it is read only when the call succeeded.
    let stat = unsafe {
        if libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    Some(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

struct FsFile(File);

impl SegmentFile for FsFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)?;
        self.0.sync_all()
    }
}

impl Storage for FsStorage {
    fn list_segments(&self) -> io::Result<Vec<u64>> {
        let mut seqs = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(seq) = name.strip_suffix(SEGMENT_SUFFIX).and_then(|s| s.parse().ok()) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        Ok(seqs)
    }

    fn open_segment_for_write(
        &self,
        seq: u64,
        mode: WriteMode,
    ) -> io::Result<Arc<dyn SegmentFile>> {
        let mut flags = 0;
        if mode.direct_io {
            flags |= libc::O_DIRECT;
        }
        if mode.dsync {
            flags |= libc::O_DSYNC;
        }
        let open = |flags| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(self.segment_path(seq))
        };
        let file = match open(flags) {
            Err(e) if mode.direct_io && e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(dir = %self.dir.display(), "O_DIRECT refused here; writing buffered");
                open(flags & !libc::O_DIRECT)?
            }
            other => other?,
        };
        Ok(Arc::new(FsFile(file)))
    }

    fn open_segment_for_read(&self, seq: u64) -> io::Result<Arc<dyn SegmentFile>> {
        Ok(Arc::new(FsFile(File::open(self.segment_path(seq))?)))
    }

    fn open_segment_for_direct_read(&self, seq: u64) -> io::Result<Option<Arc<dyn SegmentFile>>> {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(self.segment_path(seq))
        {
            Ok(file) => Ok(Some(Arc::new(FsFile(file)))),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn create_segment(&self, seq: u64, size: u64) -> io::Result<()> {
        let temp = self.dir.join(format!("{TEMP_PREFIX}{seq:020}{SEGMENT_SUFFIX}"));
        let result =
            fill(&temp, size, Fill::Zeros).and_then(|()| fs::rename(&temp, self.segment_path(seq)));
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result?;
        self.sync_dir()
    }

    fn recycle_segment(&self, from: u64, to: u64) -> io::Result<()> {
        fs::rename(self.segment_path(from), self.segment_path(to))?;
        self.sync_dir()
    }

    fn remove_segments(&self, seqs: &[u64]) -> io::Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        for &seq in seqs {
            fs::remove_file(self.segment_path(seq))?;
        }
        self.sync_dir()
    }

    fn write_file_atomic(&self, name: &str, data: &[u8]) -> io::Result<()> {
        write_file_atomic(&self.dir, name, data)
    }

    fn read_file(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.dir.join(name)) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn remove_file(&self, name: &str) -> io::Result<()> {
        match fs::remove_file(self.dir.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn create_reserve(&self, size: u64) -> io::Result<()> {
        let temp = self.dir.join(format!("{TEMP_PREFIX}{RESERVE_FILE}"));
        let result =
            allocate(&temp, size).and_then(|()| fs::rename(&temp, self.dir.join(RESERVE_FILE)));
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result?;
        self.sync_dir()
    }

    fn reserve_len(&self) -> io::Result<Option<u64>> {
        match fs::metadata(self.dir.join(RESERVE_FILE)) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn remove_reserve(&self) -> io::Result<()> {
        match fs::remove_file(self.dir.join(RESERVE_FILE)) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn free_bytes(&self) -> Option<u64> {
        free_bytes(&self.dir)
    }

    fn remove_temporaries(&self) -> io::Result<()> {
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reserve's fallback where `fallocate` is refused: every 4 KiB block different and
    /// none of them zeros, so a compressing or deduplicating file system must store it all.
    #[test]
    fn a_noise_filled_file_has_no_two_blocks_alike() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("noise");
        let size = (1 << 20) + 1000; // not a whole number of chunks or blocks
        fill(&path, size, Fill::Noise).unwrap();
        let data = fs::read(&path).unwrap();
        assert_eq!(data.len() as u64, size);
        let blocks: std::collections::HashSet<&[u8]> = data.chunks(4096).collect();
        assert_eq!(blocks.len(), data.len().div_ceil(4096), "a block repeats");
        let zeros = data.iter().filter(|&&b| b == 0).count();
        assert!(zeros < data.len() / 128, "{zeros} zero bytes: not noise");
    }
}
