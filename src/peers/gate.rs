//! Who holds the peer server's connections. Anyone who can reach the port can open one, and
//! the node's other users can: a connection is "unproven" until its first request is signed
//! with the job's secret, and unproven connections are few, per address and in all, the oldest
//! closed to make room for a new one. So a stranger opening connections by the hundred only
//! closes its own earlier ones, while a node of the job, whose connection sends a signed
//! request at once, is proven within a round trip and keeps its connection ("proven", up to
//! `MAX_PROVEN`). A request that is not signed closes its connection (`server`).
//!
//! Addresses are counted as their host: all of loopback (127.0.0.0/8, ::1) is one, since any
//! local user may connect from any of it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Unproven connections from one address at most.
pub const UNPROVEN_PER_ADDRESS: usize = 16;
/// Unproven connections in all at most.
pub const UNPROVEN: usize = 128;
/// Connections of the job's nodes at most (each node keeps a few per reading thread).
pub const MAX_PROVEN: usize = 1024;

/// One connection's place.
pub struct Ticket {
    id: u64,
    from: IpAddr,
    proven: AtomicBool,
}

/// Connections by address, unproven ones in the order they came.
#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next: u64,
    unproven: HashMap<IpAddr, VecDeque<(u64, oneshot::Sender<()>)>>,
    unproven_total: usize,
    proven: usize,
    /// Connections closed to make room, since start.
    evicted: u64,
}

/// An address as counted: loopback as one.
fn counted(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_loopback() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, |v4| counted(IpAddr::V4(v4))),
        ip => ip,
    }
}

impl Gate {
    /// Lets in a new connection from `from`, unproven, closing the oldest unproven one of the
    /// same address (or, with none there, of the address holding most) when there is no room;
    /// its ticket, and what tells it that it was closed to make room.
    pub fn admit(&self, from: IpAddr) -> (Arc<Ticket>, oneshot::Receiver<()>) {
        let from = counted(from);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mine = state.unproven.get(&from).map_or(0, VecDeque::len);
        if mine >= UNPROVEN_PER_ADDRESS {
            state.evict_oldest(from);
        } else if state.unproven_total >= UNPROVEN {
            let busiest = state
                .unproven
                .iter()
                .max_by_key(|(_, q)| q.len())
                .map(|(ip, _)| *ip);
            if let Some(ip) = busiest {
                state.evict_oldest(ip);
            }
        }
        let id = state.next;
        state.next += 1;
        let (close, closed) = oneshot::channel();
        state
            .unproven
            .entry(from)
            .or_default()
            .push_back((id, close));
        state.unproven_total += 1;
        let ticket = Arc::new(Ticket {
            id,
            from,
            proven: AtomicBool::new(false),
        });
        (ticket, closed)
    }

    /// The connection of `ticket` sent a signed request: it is the job's, and keeps its place
    /// (false when the job's nodes hold `MAX_PROVEN` already: it is refused as busy).
    pub fn prove(&self, ticket: &Ticket) -> bool {
        if ticket.proven.load(Ordering::Relaxed) {
            return true;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.proven >= MAX_PROVEN {
            return false;
        }
        if state.forget_unproven(ticket) {
            state.proven += 1;
            ticket.proven.store(true, Ordering::Relaxed);
            return true;
        }
        // Closed to make room in the meantime: its answer goes out, then it closes.
        false
    }

    /// The connection of `ticket` ended.
    pub fn leave(&self, ticket: &Ticket) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if ticket.proven.load(Ordering::Relaxed) {
            state.proven -= 1;
        } else {
            state.forget_unproven(ticket);
        }
    }

    /// Connections closed to make room for others, since start.
    pub fn evicted(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).evicted
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap();
        (state.unproven_total, state.proven)
    }
}

impl State {
    fn evict_oldest(&mut self, from: IpAddr) {
        let Some(queue) = self.unproven.get_mut(&from) else {
            return;
        };
        if let Some((_, close)) = queue.pop_front() {
            let _ = close.send(());
            self.unproven_total -= 1;
            self.evicted += 1;
        }
        if queue.is_empty() {
            self.unproven.remove(&from);
        }
    }

    /// Removes `ticket` from the unproven ones; false if it was not there (closed already).
    fn forget_unproven(&mut self, ticket: &Ticket) -> bool {
        let Some(queue) = self.unproven.get_mut(&ticket.from) else {
            return false;
        };
        let Some(at) = queue.iter().position(|(id, _)| *id == ticket.id) else {
            return false;
        };
        queue.remove(at);
        self.unproven_total -= 1;
        if queue.is_empty() {
            self.unproven.remove(&ticket.from);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_stranger_flooding_closes_only_its_own_unproven_connections() {
        let gate = Gate::default();
        let node = gate.admit(ip("10.0.0.2"));
        let mut strangers: Vec<_> = (0..600)
            .map(|i| gate.admit(ip(&format!("127.0.0.{}", i % 250 + 1))))
            .collect();
        // All of loopback counts as one address: 16 of its 600 are held, the rest closed.
        let open = strangers
            .iter_mut()
            .map(|(_, closed)| closed.try_recv().is_err())
            .filter(|open| *open)
            .count();
        assert_eq!(open, UNPROVEN_PER_ADDRESS);
        assert_eq!(gate.evicted(), 600 - UNPROVEN_PER_ADDRESS as u64);
        // The node's connection was never closed, and proves itself.
        let (ticket, mut closed) = node;
        assert!(closed.try_recv().is_err());
        assert!(gate.prove(&ticket));
        assert_eq!(gate.counts(), (UNPROVEN_PER_ADDRESS, 1));
        gate.leave(&ticket);
        for (t, _) in &strangers {
            gate.leave(t);
        }
        assert_eq!(gate.counts(), (0, 0));
    }

    #[test]
    fn when_all_unproven_places_are_taken_the_busiest_address_gives_one_up() {
        let gate = Gate::default();
        let mut held = Vec::new();
        for i in 0..UNPROVEN {
            // 8 addresses of 16 each fill every place.
            held.push(gate.admit(ip(&format!("10.1.{}.1", i % 8))));
        }
        held.push(gate.admit(ip("10.9.9.9")));
        assert_eq!(gate.counts().0, UNPROVEN);
        let closed: Vec<usize> = (0..held.len())
            .filter(|&i| held[i].1.try_recv().is_ok())
            .collect();
        assert_eq!(closed.len(), 1);
        // One closed to make room cannot prove itself afterwards; the newcomer can.
        assert!(!gate.prove(&held[closed[0]].0));
        assert!(gate.prove(&held[UNPROVEN].0));
    }

    #[test]
    fn v4_mapped_and_v6_loopback_count_as_loopback() {
        assert_eq!(counted(ip("::1")), ip("127.0.0.1"));
        assert_eq!(counted(ip("::ffff:127.0.0.9")), ip("127.0.0.1"));
        assert_eq!(counted(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(counted(ip("fe80::1")), ip("fe80::1"));
    }
}
