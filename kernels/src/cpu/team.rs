//! The CPU runtime's fork-join team: one helper thread per extra core that spins while
//! work keeps coming, so a decode step's ~150 parallel loops (four matrix products and
//! the attention per layer) each start in well under a microsecond. rayon parks idle
//! workers on a futex and the waker pays the syscall and the wakee's scheduling latency
//! at every loop: measured on the 2-core VM, that cost a single-stream decode step a
//! quarter of its time. Like llama.cpp's thread pool, helpers spin for a while after the
//! last loop, then sleep until woken.
//!
//! The team has `rayon::current_num_threads()` members (so `RAYON_NUM_THREADS` sets
//! both); the calling thread is member 0. A loop started while another is running (two
//! runtimes stepping at once, as tests do) runs on the caller alone.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a helper spins after its last job before it sleeps.
const SPIN: Duration = Duration::from_millis(5);

/// A job as the helpers see it: a pointer to the caller's `&dyn Fn(member)`.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped for each loop; helpers run the job when they see it change.
    epoch: AtomicU64,
    /// The current job (a `*const Job`), valid until `pending` reaches 0.
    job: AtomicPtr<()>,
    /// Helpers still running the current job.
    pending: AtomicUsize,
    /// Helpers asleep (they are unparked when a job comes).
    sleepers: AtomicUsize,
    /// The payload of a helper's panic in the current job, raised by the caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    stop: AtomicBool,
}

/// A fixed team of threads for parallel loops (see the module docs).
pub(super) struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    busy: AtomicBool,
}

/// The process's team, started on first use.
pub(super) fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| Team::new(rayon::current_num_threads().max(1)))
}

impl Team {
    fn new(members: usize) -> Team {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panic: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        // Members are numbered without gaps: the team stops growing at a thread that fails
        // to start.
        let helpers = (1..members)
            .map_while(|me| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("cpu-team-{me}"))
                    .spawn(move || helper(&shared, me))
                    .ok()
            })
            .collect();
        Team {
            shared,
            helpers,
            busy: AtomicBool::new(false),
        }
    }

    /// Members, the caller included.
    pub(super) fn members(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `f(member)` on every member at once and returns when all have finished. A
    /// panic in any member is raised here, after all have stopped.
    fn broadcast(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.helpers.is_empty() || self.busy.swap(true, Acquire) {
            // Alone, or another loop holds the team: every member's share on the caller.
            for me in 0..self.members() {
                f(me);
            }
            return;
        }
        let s = &self.shared;
        let job: Job = f;
        s.pending.store(self.helpers.len(), Relaxed);
        s.job.store((&job as *const Job).cast_mut().cast(), Relaxed);
        // SeqCst with the sleepers' count: either a helper going to sleep sees the new
        // epoch, or this thread sees it asleep and unparks it.
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            for h in &self.helpers {
                h.thread().unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        // `job` borrows this frame: wait for every helper before leaving it, even when
        // unwinding.
        while s.pending.load(Acquire) != 0 {
            std::hint::spin_loop();
        }
        // This job's helper panic, taken before the team is free for the next caller.
        let theirs = s.panic.lock().map(|mut p| p.take()).unwrap_or(None);
        self.busy.store(false, Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }

    /// Splits `data` into chunks of `chunk` elements and gives each member a contiguous
    /// run of them (weights stream from memory in order): `f(chunk index, chunk)`.
    pub(super) fn for_each_chunk<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunks = Chunks::new(data, chunk);
        let members = self.members();
        self.broadcast(&|me| {
            let count = chunks.count;
            for c in count * me / members..count * (me + 1) / members {
                // SAFETY: members take disjoint ranges of chunk indices.
                f(c, unsafe { chunks.get(c) });
            }
        });
    }

    /// As [`Team::for_each_chunk`], with chunks handed out one at a time to whichever
    /// member is free (for chunks of uneven cost, as causal attention's rows).
    pub(super) fn for_each_chunk_dynamic<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunks = Chunks::new(data, chunk);
        let next = AtomicUsize::new(0);
        self.broadcast(&|_| loop {
            let c = next.fetch_add(1, Relaxed);
            if c >= chunks.count {
                break;
            }
            // SAFETY: each chunk index is claimed once.
            f(c, unsafe { chunks.get(c) });
        });
    }
}

/// A mutable slice cut into chunks that the members take one by one, each chunk by one
/// member only.
struct Chunks<'a, T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
    count: usize,
    _data: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: members get disjoint chunks of a `Send` slice (see `Chunks::get`).
unsafe impl<T: Send> Sync for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    fn new(data: &'a mut [T], chunk: usize) -> Chunks<'a, T> {
        let chunk = chunk.max(1);
        Chunks {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            chunk,
            count: data.len().div_ceil(chunk),
            _data: std::marker::PhantomData,
        }
    }

    /// Chunk `c` (`c < count`).
    ///
    /// # Safety
    /// No other live reference to chunk `c` may exist.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, c: usize) -> &mut [T] {
        let (lo, hi) = (c * self.chunk, ((c + 1) * self.chunk).min(self.len));
        assert!(lo <= hi && hi <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(lo), hi - lo)
    }
}

fn helper(s: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Acquire);
            if e != seen {
                break e;
            }
            if s.stop.load(Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) || idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Asleep until a job comes: the caller unparks sleepers after bumping the
            // epoch (SeqCst on both sides: one of the two sees the other).
            s.sleepers.fetch_add(1, SeqCst);
            if s.epoch.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                thread::park();
            }
            s.sleepers.fetch_sub(1, SeqCst);
        };
        seen = epoch;
        let job = s.job.load(Relaxed).cast::<Job>().cast_const();
        // SAFETY: the caller published `job` before the epoch (read with Acquire above)
        // and keeps it alive until `pending` reaches 0, which this helper's decrement
        // below is part of.
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(me) })) {
            // Kept for the caller (dropping it here could panic again and end this thread).
            if let Ok(mut slot) = s.panic.lock() {
                slot.get_or_insert(p);
            }
        }
        s.pending.fetch_sub(1, Release);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        for h in self.helpers.drain(..) {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once_by_both_schedules() {
        let team = Team::new(3);
        for len in [0usize, 1, 5, 64, 1000] {
            for chunk in [1usize, 3, 16] {
                let mut v = vec![0u32; len];
                team.for_each_chunk(&mut v, chunk, |c, part| {
                    for (j, x) in part.iter_mut().enumerate() {
                        *x += (c * chunk + j) as u32 + 1;
                    }
                });
                team.for_each_chunk_dynamic(&mut v, chunk, |c, part| {
                    for (j, x) in part.iter_mut().enumerate() {
                        *x += (c * chunk + j) as u32 + 1;
                    }
                });
                let want: Vec<u32> = (0..len as u32).map(|i| 2 * (i + 1)).collect();
                assert_eq!(v, want, "len {len} chunk {chunk}");
            }
        }
    }

    #[test]
    fn a_panicking_member_is_reported_and_the_team_goes_on() {
        let team = Team::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut v = vec![0u8; 4];
            team.for_each_chunk(&mut v, 1, |c, _| assert!(c < 2, "boom"));
        }));
        assert!(r.is_err());
        let mut v = vec![0u8; 4];
        team.for_each_chunk(&mut v, 1, |_, p| p[0] = 1);
        assert_eq!(v, [1; 4]);
    }
}
