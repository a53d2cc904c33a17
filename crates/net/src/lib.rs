//! Socket plumbing shared by the storage protocol's two ends (the storage node and the broker's
//! ledger client).
//!
//! [`DirectWriter`] writes a connection's frames. The usual shape (a writer task fed by a
//! channel) costs a wake-up of that task per frame when the connection is idle, and on a
//! sync-publish round trip a storage-node add crosses two such connections twice: measured
//! on this machine's VM, each hand-off between threads is several microseconds. So a frame is
//! written at once, from the thread that produced it (a journal completion thread, a writer
//! task), when nothing is queued ahead of it and the socket takes it whole; otherwise it is
//! queued and the writer task ([`DirectWriter::run`]) writes it. A producer of many frames at
//! once (a run of a journal group's answers, a writer's batch of adds) queues them
//! ([`DirectWriter::queue`]) and flushes once: one write for the run instead of one per frame
//! (unbatched 128 B publishing over two nodes went from 51 k to 163 k msg/s with that, the
//! syscalls and the peer's wake-ups per frame being most of both ends' CPU). Bytes leave in
//! the order `send` and `queue` were called. Over TLS ([`DirectWriter::run_stream`]) the
//! session's state is the writer task's alone: every frame is queued and written by it.

use bytes::BytesMut;
use parking_lot::Mutex;
use std::io;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// Bytes written in one go by the writer task.
const WRITE_BATCH: usize = 1 << 20;

/// The connection is closed: it failed, its peer fell `limit` bytes behind, or it was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

pub struct DirectWriter {
    state: Mutex<State>,
    wake: Notify,
    /// Most bytes queued before the peer is cut off (it reads nothing).
    limit: usize,
}

#[derive(Default)]
struct State {
    /// Set once the socket is connected ([`DirectWriter::run`] started).
    socket: Option<std::sync::Arc<OwnedWriteHalf>>,
    queued: BytesMut,
    /// The writer task holds bytes taken from `queued` and not yet written: nothing may be
    /// written directly until it is done.
    writing: bool,
    closed: bool,
}

impl DirectWriter {
    /// A writer with nothing to write to yet: frames sent before [`DirectWriter::run`] wait.
    pub fn new(limit: usize) -> DirectWriter {
        DirectWriter { state: Mutex::new(State::default()), wake: Notify::new(), limit }
    }

    /// Writes `frame` now if nothing is queued ahead of it, else queues it for the writer task.
    pub fn send(&self, frame: &[u8]) -> Result<(), Closed> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(Closed);
        }
        let rest = match self.try_write_now(&mut state, frame) {
            Ok(rest) => rest,
            Err(Closed) => {
                drop(state);
                self.wake.notify_one();
                return Err(Closed);
            }
        };
        if rest.is_empty() {
            return Ok(());
        }
        self.enqueue(state, rest, true)
    }

    /// Queues `frame` behind what is queued, written at the next [`DirectWriter::flush`] (or
    /// [`DirectWriter::send`]): a burst of frames then leaves in one write.
    pub fn queue(&self, frame: &[u8]) -> Result<(), Closed> {
        let state = self.state.lock();
        if state.closed {
            return Err(Closed);
        }
        self.enqueue(state, frame, false)
    }

    /// Writes what [`DirectWriter::queue`] left now if the writer task is not writing, and
    /// leaves the rest to the task.
    pub fn flush(&self) {
        let mut state = self.state.lock();
        if state.closed || state.queued.is_empty() {
            return;
        }
        if !state.writing {
            if let Some(socket) = state.socket.clone() {
                match socket.try_write(&state.queued) {
                    Ok(n) if n == state.queued.len() => {
                        state.queued.clear(); // keeps the buffer for the next run
                        return;
                    }
                    Ok(n) => bytes::Buf::advance(&mut state.queued, n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => state.closed = true,
                }
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Writes as much of `frame` as the socket takes now when nothing is queued or being
    /// written ahead of it; what is left to queue.
    fn try_write_now<'f>(&self, state: &mut State, frame: &'f [u8]) -> Result<&'f [u8], Closed> {
        if state.writing || !state.queued.is_empty() {
            return Ok(frame);
        }
        let Some(socket) = &state.socket else { return Ok(frame) };
        match socket.try_write(frame) {
            Ok(n) => Ok(&frame[n..]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(frame),
            Err(_) => {
                state.closed = true;
                Err(Closed)
            }
        }
    }

    /// Appends `bytes` to the queue (waking the writer task if `wake`), or closes the
    /// connection if that would put it past its limit.
    fn enqueue(
        &self,
        mut state: parking_lot::MutexGuard<'_, State>,
        bytes: &[u8],
        wake: bool,
    ) -> Result<(), Closed> {
        let fits = state.queued.len() + bytes.len() <= self.limit;
        if fits {
            state.queued.extend_from_slice(bytes);
        } else {
            state.closed = true;
        }
        drop(state);
        if wake || !fits {
            self.wake.notify_one();
        }
        if fits {
            Ok(())
        } else {
            Err(Closed)
        }
    }

    /// Closes the connection's sending side: later sends fail, [`DirectWriter::run`] returns.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Writes what [`DirectWriter::send`] queued into `socket` until the connection is closed
    /// (`Ok`) or a write fails (`Err`; the writer is closed then too). Frames are also written
    /// straight into the socket by the threads that send them when nothing is queued.
    pub async fn run(&self, socket: OwnedWriteHalf) -> io::Result<()> {
        let socket = std::sync::Arc::new(socket);
        self.state.lock().socket = Some(socket.clone());
        self.drain(Sink::Socket(socket)).await
    }

    /// As [`DirectWriter::run`] into a stream that only this task may write (a TLS session
    /// encrypts in order, under its own state): every frame is queued and written here.
    pub async fn run_stream(
        &self,
        stream: impl AsyncWrite + Unpin + Send + 'static,
    ) -> io::Result<()> {
        self.drain(Sink::Stream(Box::new(stream))).await
    }

    /// Writes what is queued each time a `send`, `flush` or `close` wakes the task (a wake-up
    /// before the task waits is kept, so none is lost), until the queue is empty. It takes no
    /// bytes unwoken: frames that `queue` left wait for their flush, as documented, even when
    /// the task is just starting.
    async fn drain(&self, mut sink: Sink) -> io::Result<()> {
        loop {
            self.wake.notified().await;
            loop {
                let batch = {
                    let mut state = self.state.lock();
                    if state.closed {
                        return Ok(());
                    }
                    if state.queued.is_empty() {
                        state.writing = false;
                        break;
                    }
                    state.writing = true;
                    let take = state.queued.len().min(WRITE_BATCH);
                    state.queued.split_to(take)
                };
                if let Err(e) = sink.write_all(&batch).await {
                    self.close();
                    return Err(e);
                }
            }
        }
    }
}

/// Where the writer task writes.
enum Sink {
    /// A plain socket, shared with the threads that write directly.
    Socket(std::sync::Arc<OwnedWriteHalf>),
    /// A stream only the writer task writes.
    Stream(Box<dyn AsyncWrite + Unpin + Send>),
}

impl Sink {
    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Socket(socket) => write_all(socket, bytes).await,
            Sink::Stream(stream) => {
                stream.write_all(bytes).await?;
                stream.flush().await
            }
        }
    }
}

async fn write_all(socket: &OwnedWriteHalf, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        socket.writable().await?;
        match socket.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let port = magnetar_test_support::free_port().expect("a free port");
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let (client, server) = tokio::join!(TcpStream::connect(("127.0.0.1", port)), async {
            listener.accept().await.expect("accept").0
        });
        (client.expect("connect"), server)
    }

    /// Frames sent before the socket exists, while it is idle and while the peer is not
    /// reading (so some are queued behind a partial write) all arrive, whole and in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_arrive_in_send_order() {
        let (client, server) = pair().await;
        let writer = Arc::new(DirectWriter::new(256 << 20));
        let frame = |i: u32| {
            let mut f = vec![(i % 251) as u8; 4 + (i as usize * 7919) % 70_000];
            f[..4].copy_from_slice(&i.to_be_bytes());
            f
        };
        let mut expected = Vec::new();
        for i in 0..10 {
            writer.send(&frame(i)).expect("open");
            expected.extend(frame(i));
        }
        let (_read, write) = client.into_split();
        let runner = tokio::spawn({
            let writer = writer.clone();
            async move { writer.run(write).await }
        });
        let sender = std::thread::spawn({
            let writer = writer.clone();
            move || {
                for i in 10..2_000 {
                    writer.send(&frame(i)).expect("open");
                }
            }
        });
        for i in 10..2_000 {
            expected.extend(frame(i));
        }
        receive_in_order(server, &expected, sender, &writer, runner).await;
        assert_eq!(writer.send(b"late"), Err(Closed));
    }

    /// Reads `expected` from `peer` (bounded), then closes `writer`: its task `runner` ends
    /// without a write error.
    async fn receive_in_order(
        mut peer: impl tokio::io::AsyncRead + Unpin,
        expected: &[u8],
        sender: std::thread::JoinHandle<()>,
        writer: &DirectWriter,
        runner: tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let mut received = vec![0; expected.len()];
        tokio::time::timeout(Duration::from_secs(30), peer.read_exact(&mut received))
            .await
            .expect("everything arrives in time")
            .expect("read");
        sender.join().expect("sender");
        assert!(received == expected, "bytes arrive in the order they were sent");
        writer.close();
        tokio::time::timeout(Duration::from_secs(10), runner)
            .await
            .expect("the writer task ends once closed")
            .expect("joined")
            .expect("no write failed");
    }

    /// Into a stream only the writer task writes (TLS), frames sent from other threads, queued
    /// and flushed, all arrive whole and in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_into_a_stream_arrive_in_send_order() {
        let (near, far) = tokio::io::duplex(4096); // small: the writer waits for the reader
        let writer = Arc::new(DirectWriter::new(64 << 20));
        let runner = tokio::spawn({
            let writer = writer.clone();
            async move { writer.run_stream(near).await }
        });
        let frame = |i: u32| {
            let mut f = vec![(i % 251) as u8; 4 + (i as usize * 131) % 9_000];
            f[..4].copy_from_slice(&i.to_be_bytes());
            f
        };
        let sender = std::thread::spawn({
            let writer = writer.clone();
            move || {
                for i in 0..1_000 {
                    if i % 3 == 0 {
                        writer.queue(&frame(i)).expect("open");
                        writer.flush();
                    } else {
                        writer.send(&frame(i)).expect("open");
                    }
                }
            }
        });
        let expected: Vec<u8> = (0..1_000).flat_map(frame).collect();
        receive_in_order(far, &expected, sender, &writer, runner).await;
    }

    /// A peer that reads nothing is cut off once `limit` bytes wait, instead of the queue
    /// growing without bound.
    #[tokio::test]
    async fn a_peer_that_reads_nothing_is_cut_off() {
        let (client, _server) = pair().await;
        let writer = Arc::new(DirectWriter::new(1 << 20));
        let (_read, write) = client.into_split();
        let runner = tokio::spawn({
            let writer = writer.clone();
            async move { writer.run(write).await }
        });
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        let outcome = loop {
            match writer.send(&chunk) {
                Ok(()) => sent += chunk.len(),
                Err(closed) => break closed,
            }
            assert!(sent < 1 << 30, "never cut off");
            tokio::task::yield_now().await;
        };
        assert_eq!(outcome, Closed);
        assert!(writer.is_closed());
        runner.abort();
    }

    /// Queued frames wait for a flush (nothing reaches the peer before it), then leave in
    /// one go, in order with frames sent around them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_frames_leave_at_the_flush_in_order() {
        let (client, mut server) = pair().await;
        let writer = Arc::new(DirectWriter::new(1 << 20));
        let (_read, write) = client.into_split();
        let runner = tokio::spawn({
            let writer = writer.clone();
            async move { writer.run(write).await }
        });
        // The writer task has the socket once `send` writes directly.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while writer.state.lock().socket.is_none() {
            assert!(tokio::time::Instant::now() < deadline, "the writer task starts");
            tokio::task::yield_now().await;
        }
        writer.send(b"first.").expect("open");
        let mut first = [0u8; 6];
        tokio::time::timeout(Duration::from_secs(10), server.read_exact(&mut first))
            .await
            .expect("a sent frame arrives at once")
            .expect("read");
        assert_eq!(&first, b"first.");
        for frame in [&b"one."[..], b"two.", b"three."] {
            writer.queue(frame).expect("open");
        }
        let mut early = [0u8; 1];
        let nothing = tokio::time::timeout(Duration::from_millis(200), server.read(&mut early));
        assert!(nothing.await.is_err(), "queued frames wait for the flush");
        writer.flush();
        writer.send(b"last.").expect("open");
        let mut rest = [0u8; 19];
        tokio::time::timeout(Duration::from_secs(10), server.read_exact(&mut rest))
            .await
            .expect("flushed frames arrive")
            .expect("read");
        assert_eq!(&rest, b"one.two.three.last.");
        writer.close();
        runner.abort();
    }
}
