//! An in-memory [`Storage`] with a disk's failure modes, for deterministic tests.
//!
//! Writes land in a volatile image at once (like the page cache) and become durable on
//! `sync_data`. [`SimStorage::crash`] throws the volatile state away: each unsynced write
//! survives whole, not at all, or torn (a random subset of its 512-byte sectors). Faults can be
//! switched on at any time: fsync errors, write errors, short writes, ENOSPC (a capacity), and
//! bit flips in durable data. One seed drives every random choice.

use crate::storage::{SegmentFile, Storage, WriteMode};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

const SECTOR: usize = 512;

/// Faults to inject; all off by default.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Every `sync_data` fails with EIO, and so does every `O_DSYNC` write (its flush).
    pub fail_sync: bool,
    /// Every segment write fails with EIO.
    pub fail_write: bool,
    /// Writes write at most half of what they are given (at least one byte).
    pub short_writes: bool,
    /// Creating files fails with ENOSPC once the stored bytes would exceed this.
    pub capacity_bytes: Option<u64>,
    /// Every read takes this long (a slow disk), without holding up writes meanwhile.
    pub read_delay: Option<std::time::Duration>,
}

#[derive(Default)]
struct SimFile {
    durable: Vec<u8>,
    current: Vec<u8>,
    unsynced: Vec<(usize, Vec<u8>)>,
}

struct State {
    files: BTreeMap<String, SimFile>,
    faults: Faults,
    rng: rand::rngs::SmallRng,
    syncs: u64,
    /// Bytes read from segment files (reads through open handles).
    bytes_read: u64,
    /// Set by `crash`: the crashed process's handles fail every call until `restart`.
    frozen: bool,
    /// The reserve file's size (its bytes are not kept: they are never read).
    reserve: Option<u64>,
}

/// See the module documentation.
#[derive(Clone)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

fn segment_name(seq: u64) -> String {
    format!("segment-{seq:020}")
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl SimStorage {
    pub fn new(seed: u64) -> Self {
        let state = State {
            files: BTreeMap::new(),
            faults: Faults::default(),
            rng: rand::rngs::SmallRng::seed_from_u64(seed),
            syncs: 0,
            bytes_read: 0,
            frozen: false,
            reserve: None,
        };
        SimStorage { state: Arc::new(Mutex::new(state)) }
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// Number of successful `sync_data` calls so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// Bytes read from segment files so far.
    pub fn segment_bytes_read(&self) -> u64 {
        self.state.lock().bytes_read
    }

    /// Bytes held by all files (their current size), the reserve's included.
    pub fn used_bytes(&self) -> u64 {
        Self::used(&self.state.lock())
    }

    fn used(state: &State) -> u64 {
        let files: u64 = state.files.values().map(|f| f.current.len() as u64).sum();
        files + state.reserve.unwrap_or(0)
    }

    /// Simulates a power loss: unsynced writes survive whole, not at all, or torn. Until
    /// `restart`, every call fails, so the crashed process can change nothing more.
    pub fn crash(&self) {
        let mut state = self.state.lock();
        state.frozen = true;
        let State { files, rng, .. } = &mut *state;
        for file in files.values_mut() {
            let mut image = std::mem::take(&mut file.durable);
            for (offset, data) in std::mem::take(&mut file.unsynced) {
                if image.len() < offset + data.len() {
                    image.resize(offset + data.len(), 0);
                }
                match rng.gen_range(0..3) {
                    0 => image[offset..offset + data.len()].copy_from_slice(&data),
                    1 => {}
                    _ => {
                        for (i, sector) in data.chunks(SECTOR).enumerate() {
                            if rng.gen_bool(0.5) {
                                let at = offset + i * SECTOR;
                                image[at..at + sector.len()].copy_from_slice(sector);
                            }
                        }
                    }
                }
            }
            file.current = image.clone();
            file.durable = image;
        }
    }

    /// Lets a new process use the storage after `crash`.
    pub fn restart(&self) {
        self.state.lock().frozen = false;
    }

    /// Flips one bit of segment `seq`, durably (media corruption).
    pub fn flip_bit(&self, seq: u64, offset: usize, bit: u8) {
        let mut state = self.state.lock();
        let file = state.files.get_mut(&segment_name(seq)).expect("segment exists");
        file.durable[offset] ^= 1 << bit;
        file.current[offset] ^= 1 << bit;
    }

    /// The current contents of segment `seq`.
    pub fn segment_bytes(&self, seq: u64) -> Vec<u8> {
        self.state
            .lock()
            .files
            .get(&segment_name(seq))
            .map(|f| f.current.clone())
            .unwrap_or_default()
    }

    fn file(&self, name: String, mode: WriteMode) -> io::Result<Arc<dyn SegmentFile>> {
        if !self.state.lock().files.contains_key(&name) {
            return Err(io::ErrorKind::NotFound.into());
        }
        Ok(Arc::new(SimHandle { state: self.state.clone(), name, dsync: mode.dsync }))
    }

    fn check_capacity(state: &State, extra: u64) -> io::Result<()> {
        if state.frozen {
            return Err(eio());
        }
        let used = Self::used(state);
        match state.faults.capacity_bytes {
            Some(capacity) if used + extra > capacity => Err(enospc()),
            _ => Ok(()),
        }
    }
}

struct SimHandle {
    state: Arc<Mutex<State>>,
    name: String,
    dsync: bool,
}

impl SegmentFile for SimHandle {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut state = self.state.lock();
        if state.frozen || state.faults.fail_write {
            return Err(eio());
        }
        let len = if state.faults.short_writes { buf.len().div_ceil(2) } else { buf.len() };
        let flush_fails = state.faults.fail_sync;
        let offset = offset as usize;
        let file = state.files.get_mut(&self.name).ok_or(io::ErrorKind::NotFound)?;
        if file.current.len() < offset + len {
            file.current.resize(offset + len, 0);
        }
        file.current[offset..offset + len].copy_from_slice(&buf[..len]);
        if self.dsync && flush_fails {
            // The write's own flush failed: the bytes may or may not survive a crash.
            file.unsynced.push((offset, buf[..len].to_vec()));
            return Err(eio());
        }
        if self.dsync {
            if file.durable.len() < offset + len {
                file.durable.resize(offset + len, 0);
            }
            file.durable[offset..offset + len].copy_from_slice(&buf[..len]);
            state.syncs += 1; // an O_DSYNC write is a write and a flush
        } else {
            file.unsynced.push((offset, buf[..len].to_vec()));
        }
        Ok(len)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let delay = self.state.lock().faults.read_delay;
        if let Some(delay) = delay {
            std::thread::sleep(delay); // the simulated disk is slow; other calls go on meanwhile
        }
        let mut state = self.state.lock();
        let file = state.files.get(&self.name).ok_or(io::ErrorKind::NotFound)?;
        let offset = (offset as usize).min(file.current.len());
        let len = buf.len().min(file.current.len() - offset);
        buf[..len].copy_from_slice(&file.current[offset..offset + len]);
        state.bytes_read += len as u64;
        Ok(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen || state.faults.fail_sync {
            return Err(eio());
        }
        state.syncs += 1;
        let file = state.files.get_mut(&self.name).ok_or(io::ErrorKind::NotFound)?;
        file.durable = file.current.clone();
        file.unsynced.clear();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let state = self.state.lock();
        Ok(state.files.get(&self.name).ok_or(io::ErrorKind::NotFound)?.current.len() as u64)
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen {
            return Err(eio());
        }
        let file = state.files.get_mut(&self.name).ok_or(io::ErrorKind::NotFound)?;
        file.current.truncate(len as usize);
        file.durable = file.current.clone();
        file.unsynced.clear();
        Ok(())
    }
}

impl Storage for SimStorage {
    fn list_segments(&self) -> io::Result<Vec<u64>> {
        let state = self.state.lock();
        Ok(state
            .files
            .keys()
            .filter_map(|name| name.strip_prefix("segment-").and_then(|s| s.parse().ok()))
            .collect())
    }

    fn open_segment_for_write(
        &self,
        seq: u64,
        mode: WriteMode,
    ) -> io::Result<Arc<dyn SegmentFile>> {
        self.file(segment_name(seq), mode)
    }

    fn open_segment_for_read(&self, seq: u64) -> io::Result<Arc<dyn SegmentFile>> {
        self.file(segment_name(seq), WriteMode { direct_io: false, dsync: false })
    }

    fn create_segment(&self, seq: u64, size: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        Self::check_capacity(&state, size)?;
        let zeros = vec![0u8; size as usize];
        let file = SimFile { durable: zeros.clone(), current: zeros, unsynced: Vec::new() };
        state.files.insert(segment_name(seq), file);
        Ok(())
    }

    fn recycle_segment(&self, from: u64, to: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen {
            return Err(eio());
        }
        let file = state.files.remove(&segment_name(from)).ok_or(io::ErrorKind::NotFound)?;
        state.files.insert(segment_name(to), file);
        Ok(())
    }

    fn remove_segments(&self, seqs: &[u64]) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen {
            return Err(eio());
        }
        for &seq in seqs {
            state.files.remove(&segment_name(seq));
        }
        Ok(())
    }

    fn write_file_atomic(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut state = self.state.lock();
        let old = state.files.get(name).map_or(0, |f| f.current.len() as u64);
        Self::check_capacity(&state, (data.len() as u64).saturating_sub(old))?;
        let file = SimFile { durable: data.to_vec(), current: data.to_vec(), unsynced: Vec::new() };
        state.files.insert(name.to_string(), file);
        Ok(())
    }

    fn read_file(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.state.lock().files.get(name).map(|f| f.current.clone()))
    }

    fn remove_file(&self, name: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen {
            return Err(eio());
        }
        state.files.remove(name);
        Ok(())
    }

    fn remove_temporaries(&self) -> io::Result<()> {
        Ok(())
    }

    fn create_reserve(&self, size: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        let old = state.reserve.take();
        if let Err(e) = Self::check_capacity(&state, size) {
            state.reserve = old;
            return Err(e);
        }
        state.reserve = Some(size);
        Ok(())
    }

    fn reserve_len(&self) -> io::Result<Option<u64>> {
        Ok(self.state.lock().reserve)
    }

    fn remove_reserve(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.frozen {
            return Err(eio());
        }
        state.reserve = None;
        Ok(())
    }

    /// Without a capacity the disk has no end: `u64::MAX` less what is used.
    fn free_bytes(&self) -> Option<u64> {
        let state = self.state.lock();
        let capacity = state.faults.capacity_bytes.unwrap_or(u64::MAX);
        Some(capacity.saturating_sub(Self::used(&state)))
    }
}
