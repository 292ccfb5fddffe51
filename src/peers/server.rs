//! The read-only server a node's mount runs for the other nodes of its job: staged chunks, or
//! byte ranges of them, by image and chunk number, over plain HTTP (hyper, on one thread of its
//! own with a small runtime; reads of the stage go to its blocking pool). Every request must be
//! signed with the job's secret; a chunk not staged here is answered 404 "not staged", and the
//! asking node reads it from the source. What is sent is what the stage's own reads trust
//! (`Stage::chunk_for_peer`).
//!
//! `GET /v1/{dataset}/{image}/{chunk}`, with `Range: bytes=A-B` for a part of it, and
//! `x-packfs-time` and `x-packfs-signature`; the answer (200 for a whole chunk, 206 for a
//! range) carries an xxh3 (`x-packfs-xxh3`: a whole chunk's as the source's record has it, a
//! range's of the bytes sent) and its signature (`x-packfs-signature`); a refusal says why in
//! `x-packfs-why`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tracing::{info, warn};
use xxhash_rust::xxh3::xxh3_64;

use super::auth::{Refused, Secret};
use super::stats::PeerTierCounters;
use crate::tiers::budget::MemoryBudget;
use crate::tiers::stage::Stage;
use crate::tiers::stage::for_peers::ForPeer;

/// Connections served at once; more are closed as they come (the node's other users can reach
/// the port: each connection costs a task and its buffers). The job's nodes keep a few each.
const MAX_CONNECTIONS: usize = 512;
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
    counters: Arc<PeerTierCounters>,
    memory: Option<Arc<MemoryBudget>>,
}

/// A running server; stopped when dropped.
pub struct PeerServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeerServer {
    /// Listens on `listen` (bound here, so a port in use fails the mount at once) and serves
    /// `stage`'s chunks to requests signed with `secret` for `dataset`.
    pub fn start(
        listen: SocketAddr,
        stage: Arc<Stage>,
        secret: Secret,
        dataset: String,
        counters: Arc<PeerTierCounters>,
    ) -> std::io::Result<PeerServer> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let memory = stage.memory().cloned();
        let ctx = Arc::new(Ctx {
            stage,
            secret,
            dataset,
            counters,
            memory,
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
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut said_full = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stopped => return,
        };
        let Ok((stream, from)) = accepted else {
            continue;
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if !said_full {
                warn!(
                    "the peer server holds {MAX_CONNECTIONS} connections: closing new ones \
                     (from {from}) until some end; their nodes read the source meanwhile"
                );
                said_full = true;
            }
            continue;
        };
        said_full = false;
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, ctx.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_BUFFER)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

fn refusal(status: StatusCode, why: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("x-packfs-why", why)
        .body(Full::new(Bytes::new()))
        .expect("a valid response")
}

/// `bytes=A-B` (inclusive, as HTTP says) as the range A..B+1.
fn parse_range(range: &str) -> Option<std::ops::Range<u64>> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    let (a, b) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
    (a <= b).then_some(a..b.checked_add(1)?)
}

/// What a request signs: the path and the range asked for.
pub fn signed_part(path: &str, range: Option<&str>) -> String {
    format!("{path} {}", range.unwrap_or(""))
}

/// `/v1/{dataset}/{image}/{chunk}` as its parts.
fn parse_path(path: &str) -> Option<(&str, u32, usize)> {
    let mut parts = path.strip_prefix("/v1/")?.split('/');
    let (dataset, image, chunk) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((dataset, image.parse().ok()?, chunk.parse().ok()?))
}

async fn answer(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != hyper::Method::GET {
        return Ok(refusal(StatusCode::METHOD_NOT_ALLOWED, "get-only"));
    }
    let path = req.uri().path().to_string();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (time, signature) = (header("x-packfs-time"), header("x-packfs-signature"));
    let range_header = header("range");
    let (Some(time), Some(signature)) = (time.and_then(|t| t.parse::<u64>().ok()), signature)
    else {
        ctx.counters.refused.fetch_add(1, Ordering::Relaxed);
        return Ok(refusal(StatusCode::UNAUTHORIZED, "unsigned"));
    };
    let what = signed_part(&path, range_header.as_deref());
    if let Err(refused) = ctx.secret.verify_request(&what, time, &signature) {
        ctx.counters.refused.fetch_add(1, Ordering::Relaxed);
        let why = match refused {
            Refused::Stale { skew } => {
                warn!("refused a peer request {skew} s off this node's clock");
                "stale"
            }
            Refused::Signature => "signature",
        };
        return Ok(refusal(StatusCode::FORBIDDEN, why));
    }
    let Some((dataset, image, chunk)) = parse_path(&path) else {
        return Ok(refusal(StatusCode::BAD_REQUEST, "path"));
    };
    if dataset != ctx.dataset {
        ctx.counters.refused.fetch_add(1, Ordering::Relaxed);
        return Ok(refusal(StatusCode::CONFLICT, "other-dataset"));
    }
    let range = match range_header.as_deref().map(parse_range) {
        Some(None) => return Ok(refusal(StatusCode::RANGE_NOT_SATISFIABLE, "range")),
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
            None => return Ok(refusal(StatusCode::SERVICE_UNAVAILABLE, "busy")),
        },
        None => None,
    };
    let stage = ctx.stage.clone();
    let whole = range.is_none();
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        stage
            .chunk_for_peer(image, chunk, range, &mut buf)
            .map(|got| (got, buf))
    })
    .await;
    drop(permit);
    match read {
        Ok(Ok((ForPeer::Checked { record }, bytes))) => {
            // A whole chunk goes with the source's record of it: the asker checks the bytes
            // against the source end to end. A range, with the xxh3 of the bytes sent.
            let (status, sum) = match whole {
                true => (StatusCode::OK, record),
                false => (StatusCode::PARTIAL_CONTENT, xxh3_64(&bytes)),
            };
            let len = bytes.len() as u64;
            ctx.counters.served_chunks.fetch_add(1, Ordering::Relaxed);
            ctx.counters.served_bytes.fetch_add(len, Ordering::Relaxed);
            Ok(Response::builder()
                .status(status)
                .header("x-packfs-xxh3", format!("{sum:016x}"))
                .header(
                    "x-packfs-signature",
                    ctx.secret.sign_answer(&signature, sum, len),
                )
                .body(Full::new(Bytes::from(bytes)))
                .expect("a valid response"))
        }
        Ok(Ok((ForPeer::NotStaged, _))) => {
            ctx.counters.not_staged.fetch_add(1, Ordering::Relaxed);
            Ok(refusal(StatusCode::NOT_FOUND, "not-staged"))
        }
        Ok(Ok((ForPeer::Damaged, _))) => {
            ctx.counters.damaged.fetch_add(1, Ordering::Relaxed);
            Ok(refusal(StatusCode::INTERNAL_SERVER_ERROR, "damaged"))
        }
        Ok(Err(e)) => {
            warn!("a peer asked for chunk {chunk} of image {image}: {e}");
            Ok(refusal(StatusCode::INTERNAL_SERVER_ERROR, "local-read"))
        }
        Err(_) => Ok(refusal(StatusCode::INTERNAL_SERVER_ERROR, "local-read")),
    }
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
        assert_eq!(parse_path("/v1/abc/3/17"), Some(("abc", 3, 17)));
        assert_eq!(parse_path("/v1/abc/3/17/x"), None);
        assert_eq!(parse_path("/v1/abc/-1/17"), None);
        assert_eq!(parse_path("/v2/abc/3/17"), None);
    }
}
