//! Nodes of one job reading each other's staged shares instead of the parallel file system.
//! Which node stages which share is a pure function of the index and `--stage-share K/N`, so
//! only a data plane is needed: each mount with a share serves its staged, verified chunks
//! (`server`), and reads an image of another share from the node that stages it first
//! (`client`), checked, falling back to the source on any failure. The job gives the nodes
//! (`nodes`) and a secret (`auth`: requests signed, answers sealed); the server answers a
//! request once (`replays`) and holds connections only for the job's nodes (`gate`).

pub mod auth;
pub mod client;
mod gate;
pub mod nodes;
mod replays;
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

/// The kernel's range of ephemeral ports (where outgoing connections take theirs), for the
/// message about a port that was taken.
pub fn ephemeral_ports() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((parts.next()??, parts.next()??))
}

/// Why this node cannot listen on `addr`, said so that the user knows what to do; the mount
/// goes on without serving (the other nodes read this share from the source).
pub fn cannot_listen(addr: SocketAddr, error: &std::io::Error) -> String {
    let port = addr.port();
    let ephemeral = match ephemeral_ports() {
        Some((low, high)) if (low..=high).contains(&port) => format!(
            " (it lies in this node's ephemeral range {low}-{high}, where any outgoing \
             connection may take it: give the job a port below {low})"
        ),
        _ => String::new(),
    };
    format!(
        "cannot listen on {addr}: {error}{ephemeral}; this node reads the other shares from \
         their nodes, but serves its own to none: the others read it from the source. Another \
         process holds the port (`ss -ltnp sport = :{port}` names it): give --peer-listen or the \
         node list another port, the same on every node"
    )
}
