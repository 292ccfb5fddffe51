//! Host names resolved once in a while, not once per request. ureq's own resolver, given a
//! timeout (every agent of ours has one), resolves each request on a thread it spawns for it:
//! a thread and a getaddrinfo (hosts file, NSS: sssd or LDAP on many clusters) per chunk read.
//! Here a name's addresses are kept for `TTL` and looked up again after; a lookup that fails is
//! not kept.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long a name's addresses are used before it is looked up again: short enough to follow an
/// endpoint that moves (object stores rotate their addresses), long enough that lookups cost
/// nothing next to reads.
const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct CachingResolver {
    inner: DefaultResolver,
    known: Mutex<HashMap<String, (Instant, Vec<SocketAddr>)>>,
}

impl Resolver for CachingResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let key = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map_or("", |a| a.as_str())
        );
        let hit = {
            let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
            known
                .get(&key)
                .filter(|(at, _)| at.elapsed() < TTL)
                .map(|(_, addrs)| addrs.clone())
        };
        if let Some(addrs) = hit {
            let mut out = self.empty();
            for a in addrs {
                out.push(a);
            }
            return Ok(out);
        }
        let got = self.inner.resolve(uri, config, timeout)?;
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        // Names come from the configuration (a store, the job's nodes): a handful.
        if known.len() > 1024 {
            known.clear();
        }
        known.insert(key, (Instant::now(), got.iter().copied().collect()));
        Ok(got)
    }
}

/// An agent of `config` whose names are resolved through a `CachingResolver`.
pub fn agent(config: Config) -> ureq::Agent {
    ureq::Agent::with_parts(
        config,
        ureq::unversioned::transport::DefaultConnector::default(),
        CachingResolver::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_looked_up_once_within_its_time() {
        let r = CachingResolver::default();
        let config = ureq::Agent::config_builder().build();
        let uri: Uri = "http://127.0.0.1:7797/v1/x".parse().unwrap();
        let a = r.resolve(&uri, &config, NextTimeout::default()).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0], "127.0.0.1:7797".parse().unwrap());
        assert_eq!(r.known.lock().unwrap().len(), 1);
        let b = r.resolve(&uri, &config, NextTimeout::default()).unwrap();
        assert_eq!(&a[..], &b[..]);
    }
}
