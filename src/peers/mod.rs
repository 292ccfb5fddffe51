//! Nodes of one job reading each other's staged shares instead of the parallel file system.
//! Which node stages which share is a pure function of the index and `--stage-share K/N`, so
//! only a data plane is needed: each mount with a share serves its staged, verified chunks
//! (`server`), and reads an image of another share from the node that stages it first
//! (`client`), checked, falling back to the source on any failure. The job gives the nodes
//! (`nodes`) and a secret (`auth`).

pub mod auth;
pub mod client;
pub mod nodes;
pub mod server;
pub mod stats;

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use crate::catalog::Catalog;

/// What a mount needs to join its job's peers.
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// The node of each share, in share order.
    pub nodes: nodes::Nodes,
    pub secret: auth::Secret,
    /// Where this node's server listens (default: its own entry of `nodes`, any interface).
    pub listen: Option<SocketAddr>,
}

/// Names the bytes peers exchange: the images (as fingerprinted) and the chunk size. Nodes
/// that mounted another index, other shards or another chunk size do not match, and refuse.
pub fn dataset_id(catalog: &Catalog, chunk_size: u64) -> String {
    let mut hash = Sha256::new();
    hash.update(chunk_size.to_le_bytes());
    for image in catalog.images() {
        let f = &image.fingerprint;
        for n in [f.size, f.head, f.tail] {
            hash.update(n.to_le_bytes());
        }
        hash.update(image.path().as_os_str().as_encoded_bytes());
        hash.update([0]);
    }
    hash.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The address this node's server listens on: `--peer-listen`, else the port of its own entry
/// in the node list, on every interface.
pub fn listen_address(opts: &PeerOptions, me: u32) -> Result<SocketAddr, String> {
    if let Some(addr) = opts.listen {
        return Ok(addr);
    }
    let mine = opts
        .nodes
        .of(me)
        .ok_or_else(|| format!("the node list has no node for share {me}"))?;
    let port = mine
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| format!("{mine}: no port"))?;
    Ok(SocketAddr::from(([0, 0, 0, 0], port)))
}
