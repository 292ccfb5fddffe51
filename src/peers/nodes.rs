//! Which node holds which share, without a service: the job names its nodes (a list, a file, or
//! Slurm's node list, expanded by Slurm's own `scontrol show hostnames`), in share order, and
//! share K of `--stage-share K/N` is staged by the K-th of them, as the share arithmetic says.
//! No ring, no registry, no lease: every node computes the same answer from the same inputs.

use std::path::Path;
use std::process::Command;

/// The port peers listen on unless an address says otherwise.
pub const DEFAULT_PORT: u16 = 7797;

#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("--peers {0:?}: no node named")]
    Empty(String),
    #[error("--peers {given:?}: {why}")]
    Bad { given: String, why: String },
    #[error(
        "--peers names {nodes} node(s) but --stage-share says {world}: node K of the list \
         serves share K, so give one node per share, in share order"
    )]
    Count { nodes: usize, world: u32 },
}

/// `host:port` of the node serving each share, in share order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes(pub Vec<String>);

impl Nodes {
    /// From what `--peers` says: `host[:port],host[:port],...`, `@FILE` (one per line, `#`
    /// comments), or `slurm` (the job's nodes, in SLURM_NODEID order).
    pub fn parse(given: &str, port: u16) -> Result<Nodes, NodesError> {
        let bad = |why: String| NodesError::Bad {
            given: given.to_string(),
            why,
        };
        let mut port = port;
        let names: Vec<String> = if given == "slurm" {
            // A port of the job's own, the same on every node: two jobs sharing a node do not
            // take each other's.
            if let Some(id) = std::env::var("SLURM_JOB_ID")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                port = slurm_port(id, 0);
            }
            slurm_nodes().map_err(bad)?
        } else if let Some(file) = given.strip_prefix('@') {
            std::fs::read_to_string(Path::new(file))
                .map_err(|e| bad(format!("cannot read {file}: {e}")))?
                .lines()
                .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        } else {
            given
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        if names.is_empty() {
            return Err(NodesError::Empty(given.to_string()));
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            out.push(with_port(&name, port).map_err(bad)?);
        }
        Ok(Nodes(out))
    }

    /// Checks the list against the shares: one node per share.
    pub fn check(&self, world: u32) -> Result<(), NodesError> {
        match self.0.len() == world as usize {
            true => Ok(()),
            false => Err(NodesError::Count {
                nodes: self.0.len(),
                world,
            }),
        }
    }

    /// The node that stages `share`.
    pub fn of(&self, share: u32) -> Option<&str> {
        self.0.get(share as usize).map(String::as_str)
    }
}

/// The first port of the Slurm jobs' peers: above the well-known and common service ports.
pub const SLURM_PORT_BASE: u16 = 11_000;
/// Peers datasets one job may have, each with a port of its own.
pub const SLURM_DATASETS: u16 = 4;
/// Jobs with ports of their own: ports up to 32759, below Linux's ephemeral range (32768-60999
/// by default), where any outgoing connection may take a port first.
pub const SLURM_JOB_SLOTS: u16 = 5_440;

/// The port of Slurm job `id`'s `dataset`-th peers dataset (0 for `--peers slurm`): unique per
/// job and dataset among jobs fewer than `SLURM_JOB_SLOTS` apart, the same on every node of a
/// job (packaging/slurm/common.sh computes the same).
pub fn slurm_port(id: u64, dataset: u16) -> u16 {
    SLURM_PORT_BASE + (id % SLURM_JOB_SLOTS as u64) as u16 * SLURM_DATASETS + dataset
}

/// `name` as `host:port` (`port` when it names none); `[v6]:port` is kept as given.
fn with_port(name: &str, port: u16) -> Result<String, String> {
    if name
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c == '@')
    {
        return Err(format!("{name:?} is not a host or host:port"));
    }
    let has_port = match name.rsplit_once(':') {
        Some((host, p)) if !host.is_empty() && !host.ends_with(':') => {
            p.parse::<u16>()
                .map_err(|_| format!("{name:?}: {p:?} is not a port"))?;
            true
        }
        _ => false,
    };
    Ok(match has_port {
        true => name.to_string(),
        false => format!("{name}:{port}"),
    })
}

/// The job's nodes in SLURM_NODEID order, as Slurm expands its own node list.
fn slurm_nodes() -> Result<Vec<String>, String> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .or_else(|_| std::env::var("SLURM_NODELIST"))
        .map_err(|_| "SLURM_JOB_NODELIST is not set: not inside a Slurm job".to_string())?;
    let out = Command::new("scontrol")
        .args(["show", "hostnames", &list])
        .output()
        .map_err(|e| format!("cannot run scontrol show hostnames: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scontrol show hostnames {list}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_or_a_file_names_one_node_per_share_in_order() {
        let nodes = Nodes::parse("n1, n2:9000,10.0.0.3", 7797).unwrap();
        assert_eq!(nodes.0, ["n1:7797", "n2:9000", "10.0.0.3:7797"]);
        assert_eq!(nodes.of(1), Some("n2:9000"));
        assert_eq!(nodes.of(3), None);
        nodes.check(3).unwrap();
        assert!(
            nodes
                .check(4)
                .unwrap_err()
                .to_string()
                .contains("one node per share")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nodes");
        std::fs::write(&file, "# the job\nn1\n\nn2 # second\n").unwrap();
        let from_file = Nodes::parse(&format!("@{}", file.display()), 1).unwrap();
        assert_eq!(from_file.0, ["n1:1", "n2:1"]);
        assert!(Nodes::parse("", 1).is_err());
        assert!(Nodes::parse("n1:http", 1).is_err());
        assert!(Nodes::parse("user@n1", 1).is_err());
        // Two jobs on one node: ports of their own, the same on each node of a job, one per
        // dataset, and none in the kernel's ephemeral range.
        assert_eq!(
            slurm_port(123_456, 0),
            11_000 + (123_456 % 5_440) as u16 * 4
        );
        let mut seen = std::collections::HashSet::new();
        for job in 1_000..1_000 + SLURM_JOB_SLOTS as u64 {
            for dataset in 0..SLURM_DATASETS {
                let port = slurm_port(job, dataset);
                assert!((11_000..32_768).contains(&port), "{job} {dataset}: {port}");
                assert!(
                    seen.insert(port),
                    "job {job} dataset {dataset}: {port} twice"
                );
            }
        }
        // Job 1000's second dataset and job 1001's first, which once shared a port.
        assert_ne!(slurm_port(1_000, 1), slurm_port(1_001, 0));
    }
}
