//! The engine: everything one dataset needs to answer reads, built in one place from its options
//! and its stores, and torn down in one place. A mount (`daemon::serve`) puts a FUSE session in
//! front of it; `packfs cat`, `verify`, `pack` and the demo read through it without mounting;
//! several engines live in one process side by side (no mount-level state is global).
//!
//! What it owns: the catalog, the tiers (source, RAM cache under the one memory budget, stage,
//! lookahead window), the stores objects are read from, the lookahead that samplers' hints
//! drive, and the background work (`background`: the stager, the watcher of images rewritten in
//! place, the index's verification).

mod background;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::{info, warn};

use crate::catalog::Catalog;
use crate::catalog::index::IndexError;
use crate::dataset::{DatasetError, Merge, OnScan};
use crate::peers::client::{PeerFirst, PeerLink};
use crate::peers::server::{PeerServer, ServeOptions};
use crate::peers::stats::PeerTierCounters;
use crate::source::Stores;
use crate::source::read_at::ReadAt;
use crate::tiers::lookahead::{Lookahead, LookaheadOptions, PageCacheProbe};
use crate::tiers::stage::{Stage, StageOptions};
use crate::tiers::{self, FileReader, OpenError, TierOptions};

/// What an engine is built from, besides its stores.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Images (paths, globs, URLs) or one index, as `packfs mount` takes them.
    pub images: Vec<String>,
    pub merge: Merge,
    /// Byte budget of the RAM tier (decoded units and source chunks); 0 for none.
    pub cache_size: u64,
    /// Size of the source chunks kept in RAM and of the staged chunks.
    pub chunk_size: u64,
    /// Read stored bytes in whole chunks through the RAM tier; unset: when staging, or when an
    /// image is in an object store (`tiers::chunks::policy::choose`).
    pub ram_chunks: Option<bool>,
    pub stage: Option<StageOptions>,
    /// Who holds the stage directory, for the message that refuses a second holder.
    pub holder: String,
    /// Bytes fetched ahead on a sampler's hints (`None`: half the RAM cache; 0: no hints).
    pub lookahead: Option<u64>,
    /// Fetches ahead in flight (`None`: by the source, `lookahead::default_depth`).
    pub lookahead_depth: Option<usize>,
    /// Write the catalog built from scanned images to this index file once built.
    pub save_index: Option<PathBuf>,
    /// Threads that read at once (for the advice on the RAM cache's size).
    pub read_threads: usize,
    /// The job's other nodes, to read their staged shares from and serve this one's to
    /// (`peers`; needs a stage with a share).
    pub peers: Option<crate::peers::PeerOptions>,
    /// Opened again for a process of a job whose first process serves the dataset already (a
    /// forked or spawned DataLoader worker): an image that changed since, or cannot be opened,
    /// fails its own files' reads, as in the first process, instead of the whole open.
    pub reopened: bool,
}

impl EngineOptions {
    /// A command that reads a few files once (`packfs cat`, `verify`, the demo): straight from
    /// the source, room for one decoded member or block, no hints, no stage.
    pub fn one_shot(images: Vec<String>, merge: Merge) -> EngineOptions {
        EngineOptions {
            images,
            merge,
            cache_size: tiers::ONE_SHOT_CACHE,
            chunk_size: tiers::DEFAULT_CHUNK,
            ram_chunks: Some(false),
            stage: None,
            holder: format!("pid {}", std::process::id()),
            lookahead: Some(0),
            lookahead_depth: None,
            save_index: None,
            read_threads: 1,
            peers: None,
            reopened: false,
        }
    }
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Tiers(#[from] OpenError),
    #[error("{0}")]
    Peers(String),
}

/// One dataset, open and ready to read.
pub struct Engine {
    catalog: Arc<Catalog>,
    files: Arc<FileReader>,
    stores: Stores,
    lookahead: Option<Arc<Lookahead>>,
    /// The files with checksums, once counted (`background::verify`).
    checksummed: Arc<OnceLock<u64>>,
    background: Mutex<Option<background::Work>>,
    /// The peer tier: its counters, and the server of this node's staged chunks.
    peers: Option<(Arc<PeerTierCounters>, Option<PeerServer>)>,
}

impl Engine {
    /// Opens the images (scanning them, or mapping their index) and stacks the tiers over them.
    /// `page_cache`, for a mount, tells the lookahead which files the kernel holds already.
    pub fn open(
        opts: &EngineOptions,
        stores: Stores,
        page_cache: Option<PageCacheProbe>,
        on_scan: OnScan,
    ) -> Result<Engine, EngineError> {
        let catalog = Arc::new(crate::dataset::open(
            &opts.images,
            &opts.merge,
            &stores,
            on_scan,
        )?);
        if let Some(dest) = &opts.save_index {
            let written = crate::catalog::index::write(&catalog, dest)?;
            info!(bytes = written.bytes, "index saved to {}", dest.display());
        }
        Engine::over(catalog, opts, stores, page_cache)
    }

    /// An engine over a catalog built already (`packfs pack` reading its own sources).
    pub fn over(
        catalog: Arc<Catalog>,
        opts: &EngineOptions,
        stores: Stores,
        page_cache: Option<PageCacheProbe>,
    ) -> Result<Engine, EngineError> {
        let mut source = match opts.reopened {
            true => tiers::OpenedImages::open_each(catalog.images(), &stores)
                .map_err(|error| OpenError::Source { error, stale: None })?,
            false => tiers::open_source(&catalog, &stores)?,
        };
        let link = match &opts.peers {
            Some(peers) => Some(peer_link(peers, opts, &catalog)?),
            None => None,
        };
        if let Some(link) = &link {
            source = source.served_by(|i, data| {
                let share = tiers::stage::share_of(i as usize, link.world());
                link.serves(share).then(|| -> Arc<dyn ReadAt> {
                    Arc::new(PeerFirst {
                        inner: data.clone(),
                        link: link.clone(),
                        image: i,
                        share,
                        size: catalog.images()[i as usize].fingerprint.size,
                    })
                })
            });
        }
        let tiers = tier_options(opts, &catalog);
        let files = Arc::new(tiers::assemble(Arc::new(source), &catalog, &tiers)?);
        let peers = match (&opts.peers, link) {
            (Some(peers), Some(link)) => Some(start_peer_server(peers, &files, link)?),
            _ => None,
        };
        let lookahead = start_lookahead(opts, &files, &catalog, page_cache);
        Ok(Engine {
            catalog,
            files,
            stores,
            lookahead,
            checksummed: Arc::new(OnceLock::new()),
            background: Mutex::new(None),
            peers,
        })
    }

    /// Starts the background work: the stager (with a stage), the watcher of images rewritten
    /// in place, the index's verification and the count of files with checksums. A mount starts
    /// it once it answers; once only.
    pub fn start(&self) {
        let mut work = self.background.lock().unwrap_or_else(|p| p.into_inner());
        if work.is_none() {
            *work = Some(background::Work::start(
                &self.files,
                &self.catalog,
                &self.checksummed,
            ));
        }
    }

    /// Stops the lookahead and the background work, and waits for the stager to leave its
    /// chunks consistent. Reads still answer (from the source) after it; dropping the engine
    /// stops it too.
    pub fn stop(&self) {
        if let Some(la) = &self.lookahead {
            la.stop();
        }
        if let Some(stage) = self.stage() {
            stage.shut_down();
        }
        let work = self
            .background
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(work) = work {
            work.stop();
        }
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn files(&self) -> &Arc<FileReader> {
        &self.files
    }

    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    pub fn lookahead(&self) -> Option<&Arc<Lookahead>> {
        self.lookahead.as_ref()
    }

    pub fn stage(&self) -> Option<&Arc<Stage>> {
        self.files.images().stage()
    }

    /// The peer tier's counters, with peers.
    pub fn peer_stats(&self) -> Option<crate::peers::stats::PeerStats> {
        self.peers.as_ref().map(|(counters, _)| counters.stats())
    }

    /// The files with checksums, once counted after `start`.
    pub fn checksummed(&self) -> &Arc<OnceLock<u64>> {
        &self.checksummed
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How this node reads the others' shares: its share and the job's nodes, checked against
/// each other.
fn peer_link(
    peers: &crate::peers::PeerOptions,
    opts: &EngineOptions,
    catalog: &Catalog,
) -> Result<Arc<PeerLink>, EngineError> {
    let share = opts
        .stage
        .as_ref()
        .and_then(|s| s.share)
        .ok_or_else(|| EngineError::Peers("--peers needs --stage (or --stage-in) and --stage-share K/N: the nodes serve each other the shares they stage".into()))?;
    peers
        .nodes
        .check(share.world)
        .map_err(|e| EngineError::Peers(e.to_string()))?;
    let counters = Arc::new(PeerTierCounters::new(peers.nodes.0.len()));
    Ok(Arc::new(PeerLink::new(
        peers.nodes.clone(),
        share.rank,
        peers.secret.clone(),
        crate::peers::dataset_id(catalog, opts.chunk_size),
        opts.chunk_size,
        counters,
    )))
}

/// The server of this node's staged chunks, listening where the job's node list says; none,
/// said once and in the counters, when the port is taken (by another user's listener, or an
/// outgoing connection's ephemeral port): the mount goes on, and the other nodes read this
/// share from the source, since an answer from whatever holds the port never opens for them.
fn start_peer_server(
    peers: &crate::peers::PeerOptions,
    files: &FileReader,
    link: Arc<PeerLink>,
) -> Result<(Arc<PeerTierCounters>, Option<PeerServer>), EngineError> {
    let stage = files
        .images()
        .stage()
        .cloned()
        .ok_or_else(|| EngineError::Peers("--peers needs a stage".into()))?;
    let listen = crate::peers::listen_address(peers, link.me()).map_err(EngineError::Peers)?;
    let host = peers.nodes.of(link.me()).unwrap_or_default().to_string();
    let counters = link.counters().clone();
    let listener = match std::net::TcpListener::bind(listen) {
        Ok(listener) => listener,
        Err(e) => {
            let why = crate::peers::cannot_listen(listen, &e);
            warn!("peers: {why}");
            let _ = counters.not_serving.set(why);
            return Ok((counters, None));
        }
    };
    let opts = ServeOptions {
        stage,
        secret: peers.secret.clone(),
        dataset: link.dataset().to_string(),
        host,
        counters: counters.clone(),
    };
    let server = PeerServer::start(listener, opts)
        .map_err(|e| EngineError::Peers(format!("cannot serve peers on {listen}: {e}")))?;
    Ok((counters, Some(server)))
}

/// The tier stack `opts` asks for.
fn tier_options(opts: &EngineOptions, catalog: &Catalog) -> TierOptions {
    let chunking = tiers::chunks::policy::choose(
        catalog.images(),
        opts.cache_size,
        opts.chunk_size,
        opts.ram_chunks,
        opts.stage.is_some(),
        opts.read_threads,
    );
    if let Some(advice) = &chunking.advice {
        info!("{advice}");
    }
    if let Some(warning) = &chunking.warning {
        warn!("{warning}");
    }
    TierOptions {
        cache_size: opts.cache_size,
        chunk_size: opts.chunk_size,
        ram_chunks: chunking.every_image,
        stage: opts.stage.clone().map(|s| (s, opts.holder.clone())),
    }
}

/// The lookahead that samplers' hints drive (none with a lookahead of 0, or without a RAM cache).
fn start_lookahead(
    opts: &EngineOptions,
    files: &Arc<FileReader>,
    catalog: &Arc<Catalog>,
    page_cache: Option<PageCacheProbe>,
) -> Option<Arc<Lookahead>> {
    let window = opts.lookahead.unwrap_or(opts.cache_size / 2);
    if window == 0 || opts.cache_size == 0 {
        return None;
    }
    let la = LookaheadOptions {
        window: window.min(opts.cache_size),
        depth: opts
            .lookahead_depth
            .unwrap_or_else(|| tiers::lookahead::default_depth(catalog.has_objects())),
        page_cache,
    };
    Some(tiers::lookahead::start(files, catalog.clone(), la))
}
