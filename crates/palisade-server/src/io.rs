//! Where a node's effects on the machine go: its disk and its blocking work.
//!
//! In production that is the operating system ([`Io::os`]): files, `fdatasync`,
//! `flock`, and threads for work that must not hold up the async threads. The
//! deterministic simulator (`palisade-sim`) runs the same code with a simulated
//! disk that keeps only what was synced across a crash, and with every piece of
//! blocking work run in line on its single thread, so that one seed gives one
//! history. The storage code reaches the disk only through [`Disk`], so both run
//! the same write-ahead log, snapshot file and directory lock.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

/// How [`Disk::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, for reading and writing.
    Existing,
    /// A new file; an existing one is an error (`AlreadyExists`).
    CreateNew,
    /// Created if missing, emptied if present.
    Truncate,
}

/// A file opened on a [`Disk`]: positioned writes, syncs, its length.
pub trait DiskFile: Send + Sync + Debug {
    /// Writes all of `buf` at `offset` (not yet durable).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
}

/// A held exclusive lock on a file (released when dropped).
pub trait DiskLock: Send + Sync + Debug {}

/// The file operations the node's storage needs, and nothing else.
pub trait Disk: Send + Sync + Debug {
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// The whole content of the file at `path` (`NotFound` if missing).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Opens the file at `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn DiskFile>>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file at `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes `dir` and everything in it.
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on the file at `path` (created if missing) and
    /// writes `content` into it; `Ok(Err(text))` with the file's content when
    /// someone else holds the lock.
    fn lock(&self, path: &Path, content: &[u8]) -> io::Result<Result<Box<dyn DiskLock>, String>>;
    /// How long the next `fdatasync` of the log takes, for a simulated disk
    /// whose syncs take no real time (used only without threads).
    fn sync_delay(&self) -> Duration {
        Duration::ZERO
    }
}

/// A byte stream to or from another node or a client, on a [`Net`].
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// A boxed future of the network's answers.
pub type NetFuture<'a, T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'a>>;

/// Accepts connections on one address of a [`Net`].
pub trait Listener: Send + 'static {
    /// The next connection and who made it.
    fn accept(&mut self) -> NetFuture<'_, (Box<dyn Conn>, SocketAddr)>;
}

/// A network other than the operating system's TCP: a simulator's. The node's
/// listeners and its channels to peers go through it; TLS does not.
pub trait Net: Send + Sync + Debug {
    /// Listens on `addr`.
    fn bind(&self, addr: SocketAddr) -> NetFuture<'static, Box<dyn Listener>>;
    /// Connects to `authority` (`HOST:PORT`).
    fn connect(&self, authority: String) -> NetFuture<'static, Box<dyn Conn>>;
}

/// What becomes of one Raft message between two nodes. Production delivers
/// every message (TCP does the rest); a simulator decides per message, to test
/// the Raft layer against what TCP would otherwise hide: messages lost,
/// repeated, overtaken by later ones, or heard in one direction only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageFate {
    /// Sent once, its reply returned.
    Deliver,
    /// Never arrives; the sender hears nothing until its call times out.
    LoseRequest,
    /// Arrives and is acted on, but the reply is lost: the sender times out.
    LoseReply,
    /// Arrives, and a copy of it arrives again after this long (its reply
    /// ignored), after messages sent later.
    Duplicate(Duration),
    /// Held this long before it is sent, so later messages can overtake it.
    Delay(Duration),
}

/// Decides each Raft message's [`MessageFate`] (see [`Io::message_fates`]).
pub trait MessageFates: Send + Sync {
    /// The fate of a message of `kind` (`append`, `vote`, `snapshot`) from
    /// node `from` to node `to`.
    fn fate(&self, from: u64, to: u64, kind: &'static str) -> MessageFate;
}

/// See [`Io::message_fates`].
#[derive(Clone)]
pub struct MessageFatesHook(pub Arc<dyn MessageFates>);

impl Debug for MessageFatesHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageFates")
    }
}

/// The node's disk and network and how it runs blocking work. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Io {
    /// Every file the node reads or writes goes through it.
    pub disk: Arc<dyn Disk>,
    /// Threads for blocking work (production), or in line (simulation).
    pub threads: bool,
    /// `None`: the operating system's TCP (production).
    pub net: Option<Arc<dyn Net>>,
    /// Bugs planted on purpose, for the simulator's own tests; none anywhere else.
    pub planted: Planted,
    /// Told of every entry the state machine applies — its index, term and a
    /// digest of its content — so that a simulator can check that every node
    /// applies the same entry at each index. `None` in production.
    pub on_apply: Option<ApplyObserver>,
    /// Where new sessions' keys come from (a simulator seeds it, so that a
    /// replay mints the same keys).
    pub session_keys: crate::security::SessionKeys,
    /// Decides the fate of each Raft message this node sends (a simulator's
    /// lossy links); `None` in production: every message is delivered.
    pub message_fates: Option<MessageFatesHook>,
    /// How fast this node's clock runs for its lease countdowns, as a multiple
    /// of the true rate: 1 in production; a simulator skews it to check that
    /// the clients' safety margin covers a leader whose clock runs fast.
    pub clock_rate: f64,
}

/// One entry a node applied, as an [`ApplyObserver`] is told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedEntry {
    /// The entry's log index.
    pub index: u64,
    /// The term of the leader that wrote it.
    pub term: u64,
    /// The node that led that term.
    pub leader: u64,
    /// A digest of its content that does not depend on the process.
    pub digest: u64,
}

/// See [`Io::on_apply`].
#[derive(Clone)]
pub struct ApplyObserver(pub Arc<dyn Fn(AppliedEntry) + Send + Sync>);

impl Debug for ApplyObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApplyObserver")
    }
}

/// Bugs the deterministic simulator must be able to find, switched on only by
/// its tests (and `palisade sim --plant`), each a one-line departure from the
/// real code. Never set in production: [`Io::os`] has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Planted {
    /// The log writer acknowledges an append before its `fdatasync`.
    pub ack_before_sync: bool,
    /// A new leader expires every session at once instead of restarting its
    /// countdown at the full TTL.
    pub no_lease_restart: bool,
    /// Departures from the recipes' rules in the state machine (an extra
    /// permit, a writer beside readers, a second leader).
    pub recipes: palisade_core::machine::RecipeBugs,
}

impl Io {
    /// The operating system's file system, and threads.
    pub fn os() -> Io {
        Io {
            disk: Arc::new(OsDisk),
            threads: true,
            net: None,
            planted: Planted::default(),
            on_apply: None,
            session_keys: Default::default(),
            message_fates: None,
            clock_rate: 1.0,
        }
    }

    /// `disk` and `net`, with all work in line on the caller's task: what a
    /// deterministic simulation needs (no thread it cannot schedule).
    pub fn simulated(disk: Arc<dyn Disk>, net: Arc<dyn Net>) -> Io {
        Io {
            disk,
            threads: false,
            net: Some(net),
            planted: Planted::default(),
            on_apply: None,
            session_keys: Default::default(),
            message_fates: None,
            clock_rate: 1.0,
        }
    }

    /// Opens connections to `addr` (`HOST:PORT`) over this network.
    pub fn dialer(&self, addr: &str) -> palisade_proto::h2_channel::Dialer {
        use palisade_proto::h2_channel::{H2Channel, Io as ChannelIo};
        match &self.net {
            None => H2Channel::tcp_dialer(addr.to_owned()),
            Some(net) => {
                let (net, addr) = (net.clone(), addr.to_owned());
                Arc::new(move || {
                    let connected = net.connect(addr.clone());
                    Box::pin(async move { Ok(Box::new(connected.await?) as Box<dyn ChannelIo>) })
                })
            }
        }
    }

    /// Runs `work` off the async threads (tokio's blocking pool), or in line.
    ///
    /// # Errors
    /// When the blocking task panicked.
    pub async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        if self.threads {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(io::Error::other)
        } else {
            Ok(work())
        }
    }

    /// A pause inside blocking work that yields the disk or the CPU to the
    /// commit path (a thread sleep); nothing in a simulation, where blocking
    /// work runs in line and a sleep would stop every node.
    pub fn pace(&self, pause: Duration) {
        if self.threads {
            std::thread::sleep(pause);
        }
    }
}

/// The operating system's file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsDisk;

impl DiskFile for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

#[derive(Debug)]
struct OsLock(#[allow(dead_code)] File);

impl DiskLock for OsLock {}

impl Disk for OsDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(dir)?
            .map(|item| Ok(item?.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn DiskFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        match mode {
            OpenMode::Existing => {}
            OpenMode::CreateNew => {
                options.create_new(true);
            }
            OpenMode::Truncate => {
                options.create(true).truncate(true);
            }
        }
        Ok(Arc::new(options.open(path)?))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock(&self, path: &Path, content: &[u8]) -> io::Result<Result<Box<dyn DiskLock>, String>> {
        use std::io::{Read, Seek, Write};
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        // flock, not `File::try_lock`: the workspace's MSRV predates it. The
        // kernel drops it when the process ends, however it ends.
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Ok(Err(text));
            }
            Err(e) => return Err(e.into()),
        }
        // Only the holder writes, so a reader never sees another holder's
        // content half-written over ours.
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(content)?;
        Ok(Ok(Box::new(OsLock(file))))
    }
}
