//! openraft's async runtime for Palisade: tokio, with a random source a
//! simulation can seed.
//!
//! openraft draws its election timeouts and tick jitter from the runtime's
//! `thread_rng`. tokio's runtime for openraft takes them from the operating
//! system, which makes one simulated history differ from the next with the same
//! seed. Here each draw seeds a small generator from a per-thread sequence:
//! from the operating system's randomness by default, and from a fixed seed
//! after [`seed_thread_rng`] — which only a simulator calls, on the one thread
//! it runs every node on.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::time::Duration;

use openraft::OptionalSend;
use openraft::async_runtime::AsyncRuntime;
use openraft_rt_tokio::TokioRuntime;
use rand_openraft::rngs::SmallRng;
use rand_openraft::{RngExt as _, SeedableRng};

thread_local! {
    /// The seed of this thread's next draw, once a simulator has set one.
    static NEXT_SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes every later `thread_rng` draw of openraft on this thread follow from
/// `seed` (deterministic simulation only).
pub fn seed_thread_rng(seed: u64) {
    NEXT_SEED.with(|s| s.set(Some(seed)));
}

/// SplitMix64: a bijective mixer, so that successive seeds are independent.
fn splitmix64(x: u64) -> u64 {
    let z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// tokio, as openraft's own tokio runtime, with [`seed_thread_rng`]'s random source.
#[derive(Debug)]
pub struct PalisadeRuntime {
    inner: TokioRuntime,
}

impl AsyncRuntime for PalisadeRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        let seed = NEXT_SEED.with(|s| {
            let seed = s.get();
            if let Some(seed) = seed {
                s.set(Some(splitmix64(seed)));
            }
            seed
        });
        SmallRng::seed_from_u64(seed.unwrap_or_else(|| rand_openraft::rng().random()))
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        PalisadeRuntime {
            inner: TokioRuntime::new(threads),
        }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.inner.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }
}
