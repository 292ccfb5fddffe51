//! The read-only server a node's mount runs for the other nodes of its job: staged chunks, or
//! byte ranges of them, by image and chunk number, over HTTP/1 (hyper, on one thread of its own
//! with a small runtime; reads of the stage go to its blocking pool). Every request must be
//! signed with the job's secret, for this node, recently, and once (`auth`, `replays`); its
//! answer is sealed so only the job can read it. A chunk not staged here is answered 404 "not
//! staged", and the asking node reads it from the source. What is sent is what the stage's own
//! reads trust (`Stage::chunk_for_peer`). Connections are held as `gate` says; a request that
//! is not signed closes its connection, and costs no log line.
//!
//! `GET /v2/{dataset}/{image}/{chunk}`, with `Range: bytes=A-B` for a part of it, and
//! `x-packfs-time`, `x-packfs-nonce` and `x-packfs-signature` (over `Host` too); the answer
//! (200 for a whole chunk, 206 for a range) is the bytes sealed with AES-256-GCM, their tag
//! last, with `x-packfs-salt` and `x-packfs-xxh3` (a whole chunk's as the source's record has
//! it, checked by the asker end to end; 0 for a range, which the seal alone covers); a refusal
//! says why in `x-packfs-why`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tracing::{info, warn};

use super::auth::{NONCE, Refused, Secret, SignedRequest, unhex, unix_now};
use super::gate::{Gate, Ticket};
use super::replays::{Replays, Seen};
use super::stats::{PeerTierCounters, Refusal};
use crate::tiers::budget::MemoryBudget;
use crate::tiers::stage::Stage;
use crate::tiers::stage::for_peers::ForPeer;

/// How long a request's headers may take to arrive (a client that sends them slowly, or not at
/// all, is dropped).
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// A connection's read buffer at most: requests are a line and a few headers.
const MAX_BUFFER: usize = 16 << 10;

/// What every request is answered from.
struct Ctx {
    stage: Arc<Stage>,
    secret: Secret,
    dataset: String,
    /// This node as the job's node list names it: what a request for it signs as `Host`.
    host: String,
    counters: Arc<PeerTierCounters>,
    memory: Option<Arc<MemoryBudget>>,
    replays: Replays,
    gate: Gate,
    /// Said once: a signed request off this node's clock; connections closed to make room.
    said_stale: AtomicBool,
    said_evicting: AtomicBool,
}

/// What the server is asked to serve, and as whom.
pub struct ServeOptions {
    pub stage: Arc<Stage>,
    pub secret: Secret,
    pub dataset: String,
    /// This node's entry in the job's node list (`host:port`).
    pub host: String,
    pub counters: Arc<PeerTierCounters>,
}

/// A running server; stopped when dropped.
pub struct PeerServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerServer {
    /// Serves on `listener` (bound by the caller: a port taken is the caller's to report) the
    /// stage's chunks to requests signed with the job's secret for this node and dataset.
    pub fn start(
        listener: std::net::TcpListener,
        opts: ServeOptions,
    ) -> std::io::Result<PeerServer> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let memory = opts.stage.memory().cloned();
        let ctx = Arc::new(Ctx {
            stage: opts.stage,
            secret: opts.secret,
            dataset: opts.dataset,
            host: opts.host,
            counters: opts.counters,
            memory,
            replays: Replays::default(),
            gate: Gate::default(),
            said_stale: AtomicBool::new(false),
            said_evicting: AtomicBool::new(false),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(8)
            .thread_name("packfs-peer-io")
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("packfs-peers".into())
            .spawn(move || runtime.block_on(serve(listener, ctx, stopped)))?;
        info!("serving staged chunks to the job's other nodes on {addr}");
        Ok(PeerServer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    ctx: Arc<Ctx>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!("the peer server cannot listen: {e}");
            return;
        }
    };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stopped => return,
        };
        let Ok((stream, from)) = accepted else {
            continue;
        };
        let evicted_before = ctx.gate.evicted();
        let (ticket, closed) = ctx.gate.admit(from.ip());
        let evicted = ctx.gate.evicted() - evicted_before;
        ctx.counters.evicted.fetch_add(evicted, Ordering::Relaxed);
        if evicted > 0 && !ctx.said_evicting.swap(true, Ordering::Relaxed) {
            warn!(
                "the peer server is closing connections that sent no signed request, to make \
                 room (the newest from {}): someone who is not of this job is opening many; \
                 the job's nodes keep theirs (counted in packfs status)",
                from.ip()
            );
        }
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let service = {
                let (ctx, ticket) = (ctx.clone(), ticket.clone());
                hyper::service::service_fn(move |req| answer(req, ctx.clone(), ticket.clone()))
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_BUFFER)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // Closed to make room: only when told so (a proven connection's sender is dropped).
            let evicted = async move {
                if closed.await.is_err() {
                    std::future::pending::<()>().await
                }
            };
            tokio::select! {
                _ = connection => {}
                _ = evicted => {}
            }
            ctx.gate.leave(&ticket);
        });
        // The new connection's task reads its request before the next accept: a node's
        // request, sent at once, proves it before a flood of others could push it out.
        tokio::task::yield_now().await;
    }
}

/// A refusal that says why; `close` ends the connection after it.
fn refusal(status: StatusCode, why: &'static str, close: bool) -> Response<Full<Bytes>> {
    let mut answer = Response::builder()
        .status(status)
        .header("x-packfs-why", why);
    if close {
        answer = answer.header("connection", "close");
    }
    answer
        .body(Full::new(Bytes::new()))
        .expect("a valid response")
}

/// `bytes=A-B` (inclusive, as HTTP says) as the range A..B+1.
fn parse_range(range: &str) -> Option<std::ops::Range<u64>> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    let (a, b) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
    (a <= b).then_some(a..b.checked_add(1)?)
}

/// What a request signs of what it asks: the path and the range.
pub fn signed_part(path: &str, range: Option<&str>) -> String {
    format!("{path} {}", range.unwrap_or(""))
}

/// `/v2/{dataset}/{image}/{chunk}` as its parts.
fn parse_path(path: &str) -> Option<(&str, u32, usize)> {
    let mut parts = path.strip_prefix("/v2/")?.split('/');
    let (dataset, image, chunk) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((dataset, image.parse().ok()?, chunk.parse().ok()?))
}

/// The request's signed headers, if it has them all, well formed.
struct Signed {
    host: String,
    time: u64,
    nonce: String,
    signature: String,
}

fn signed_headers(req: &Request<Incoming>) -> Option<Signed> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let nonce = header("x-packfs-nonce").filter(|n| unhex(n).is_some_and(|b| b.len() == NONCE))?;
    Some(Signed {
        host: header("host")?,
        time: header("x-packfs-time")?.parse().ok()?,
        nonce,
        signature: header("x-packfs-signature")?,
    })
}

async fn answer(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
    ticket: Arc<Ticket>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let refuse = |why: Refusal, status: StatusCode, close: bool| {
        ctx.counters.refused_for(why);
        Ok(refusal(status, why.name(), close))
    };
    if req.method() != hyper::Method::GET {
        return refuse(Refusal::Unsigned, StatusCode::METHOD_NOT_ALLOWED, true);
    }
    // Anything not signed by the job closes its connection and is only counted: a stranger's
    // requests cost neither a held connection nor a log line.
    let Some(signed) = signed_headers(&req) else {
        return refuse(Refusal::Unsigned, StatusCode::UNAUTHORIZED, true);
    };
    let path = req.uri().path().to_string();
    let range_header = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let what = signed_part(&path, range_header.as_deref());
    let request = SignedRequest {
        host: &signed.host,
        what: &what,
        time: signed.time,
        nonce: &signed.nonce,
    };
    match ctx.secret.verify_request(&request, &signed.signature) {
        Ok(()) => {}
        Err(Refused::Signature) => {
            return refuse(Refusal::Signature, StatusCode::FORBIDDEN, true);
        }
        Err(Refused::Stale { skew }) => {
            // Signed by the job: a node's clock is off (or a capture was sent again). Said
            // once; counted always.
            if !ctx.said_stale.swap(true, Ordering::Relaxed) {
                warn!(
                    "refused a peer request signed {skew} s off this node's clock (more than \
                     60 s): check the job's nodes' clocks (NTP); further ones are counted in \
                     packfs status (peers.refusals.stale)"
                );
            }
            return refuse(Refusal::Stale, StatusCode::FORBIDDEN, true);
        }
    }
    // A request signed for another node, or answered already, is a capture sent again: it
    // closes its connection as an unsigned one does.
    if signed.host != ctx.host {
        return refuse(Refusal::OtherNode, StatusCode::MISDIRECTED_REQUEST, true);
    }
    match ctx
        .replays
        .first_use(&signed.nonce, signed.time, unix_now())
    {
        Ok(()) => {}
        Err(Seen::Replayed) => return refuse(Refusal::Replay, StatusCode::FORBIDDEN, true),
        Err(Seen::Full) => return refuse(Refusal::Busy, StatusCode::SERVICE_UNAVAILABLE, false),
    }
    // Only now is the connection the job's: it keeps its place.
    if !ctx.gate.prove(&ticket) {
        return refuse(Refusal::Busy, StatusCode::SERVICE_UNAVAILABLE, true);
    }
    let Some((dataset, image, chunk)) = parse_path(&path) else {
        return Ok(refusal(StatusCode::BAD_REQUEST, "path", false));
    };
    if dataset != ctx.dataset {
        return refuse(Refusal::OtherDataset, StatusCode::CONFLICT, false);
    }
    let range = match range_header.as_deref().map(parse_range) {
        Some(None) => return Ok(refusal(StatusCode::RANGE_NOT_SATISFIABLE, "range", false)),
        Some(Some(range)) => Some(range),
        None => None,
    };
    let len = match &range {
        Some(r) => r.end - r.start,
        None => ctx.stage.chunk_size(),
    };
    // The chunk's bytes are held from the mount's one budget; none to spare: the asker goes to
    // the source (counted there as "busy").
    let permit = match &ctx.memory {
        Some(memory) => match memory.try_acquire_reclaiming(len) {
            Some(permit) => Some(permit),
            None => return Ok(refusal(StatusCode::SERVICE_UNAVAILABLE, "busy", false)),
        },
        None => None,
    };
    let whole = range.is_none();
    // Read and sealed in the blocking pool: sealing a chunk takes a fraction of a millisecond,
    // which on the server's one thread would hold every other connection and accept.
    let sealer = ctx.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        let record = match sealer.stage.chunk_for_peer(image, chunk, range, &mut buf)? {
            ForPeer::Checked { record } => record,
            refused => return Ok(Err(refused)),
        };
        // A whole chunk goes with the source's record of it: the asker checks the bytes
        // against the source end to end. A range is covered by the seal alone.
        let sum = if whole { record } else { 0 };
        let len = buf.len() as u64;
        let salt = sealer
            .secret
            .seal_answer(&signed.signature, &signed.nonce, sum, &mut buf);
        std::io::Result::Ok(Ok((sum, len, salt, buf)))
    })
    .await;
    let answer = match read {
        Ok(Ok(Ok((sum, len, salt, sealed)))) => {
            let status = match whole {
                true => StatusCode::OK,
                false => StatusCode::PARTIAL_CONTENT,
            };
            ctx.counters.served_chunks.fetch_add(1, Ordering::Relaxed);
            ctx.counters.served_bytes.fetch_add(len, Ordering::Relaxed);
            Response::builder()
                .status(status)
                .header("x-packfs-xxh3", format!("{sum:016x}"))
                .header("x-packfs-salt", salt)
                .body(Full::new(Bytes::from(sealed)))
                .expect("a valid response")
        }
        Ok(Ok(Err(ForPeer::Damaged))) => {
            ctx.counters.damaged.fetch_add(1, Ordering::Relaxed);
            refusal(StatusCode::INTERNAL_SERVER_ERROR, "damaged", false)
        }
        // `Checked` never comes here: it is sealed and answered above.
        Ok(Ok(Err(ForPeer::NotStaged | ForPeer::Checked { .. }))) => {
            ctx.counters.not_staged.fetch_add(1, Ordering::Relaxed);
            refusal(StatusCode::NOT_FOUND, "not-staged", false)
        }
        Ok(Err(e)) => {
            warn!("a peer asked for chunk {chunk} of image {image}: {e}");
            refusal(StatusCode::INTERNAL_SERVER_ERROR, "local-read", false)
        }
        Err(_) => refusal(StatusCode::INTERNAL_SERVER_ERROR, "local-read", false),
    };
    drop(permit);
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::{parse_path, parse_range};

    #[test]
    fn ranges_are_inclusive_and_whole() {
        assert_eq!(parse_range("bytes=0-0"), Some(0..1));
        assert_eq!(parse_range("bytes=10-19"), Some(10..20));
        assert_eq!(parse_range("bytes=10-"), None);
        assert_eq!(parse_range("bytes=-5"), None);
        assert_eq!(parse_range("bytes=9-3"), None);
        assert_eq!(parse_range("bytes=0-1,4-5"), None);
        assert_eq!(parse_range("bytes=0-18446744073709551615"), None);
    }

    #[test]
    fn paths_name_a_dataset_an_image_and_a_chunk() {
        assert_eq!(parse_path("/v2/abc/3/17"), Some(("abc", 3, 17)));
        assert_eq!(parse_path("/v2/abc/3/17/x"), None);
        assert_eq!(parse_path("/v2/abc/-1/17"), None);
        assert_eq!(parse_path("/v1/abc/3/17"), None);
    }
}
