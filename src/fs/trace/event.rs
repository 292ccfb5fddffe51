//! One trace event, as `--trace` writes it and `packfs trace summarize` reads it back: the Chrome
//! trace-event format (JSON array, one event per line) that Perfetto and chrome://tracing load.
//! Metadata events (`ph` "M") name the process and threads and close the trace; complete events
//! (`ph` "X") are requests. One type for both sides, so the two cannot drift apart.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// The name of the metadata event that closes a trace (its absence: the trace was cut short).
pub const TRACE_END: &str = "packfs_trace_end";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ph")]
pub enum Event<'a> {
    #[serde(rename = "M")]
    Meta {
        #[serde(borrow)]
        name: Cow<'a, str>,
        pid: u32,
        tid: u32,
        #[serde(borrow)]
        args: MetaArgs<'a>,
    },
    /// One request: `name` is the operation, `ts` its start and `dur` its duration in µs.
    #[serde(rename = "X")]
    Request {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(borrow)]
        cat: Cow<'a, str>,
        ts: f64,
        dur: f64,
        pid: u32,
        tid: u32,
        #[serde(borrow)]
        args: RequestArgs<'a>,
    },
}

/// What a metadata event says: a process's or thread's `name`, or, at the end, how many
/// requests were left out and the size limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaArgs<'a> {
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
}

/// A request's inode and path (for a lookup: the directory's path and the name asked for), its
/// range, and what it answered: `bytes`, or the `errno`; for a read, the tiers that served it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestArgs<'a> {
    pub ino: u64,
    #[serde(borrow)]
    pub path: Cow<'a, str>,
    pub offset: u64,
    pub size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Cow<'a, str>>,
}

impl Event<'_> {
    /// A process or thread name.
    pub fn named(what: &'static str, pid: u32, tid: u32, name: String) -> Event<'static> {
        Event::Meta {
            name: Cow::Borrowed(what),
            pid,
            tid,
            args: MetaArgs {
                name: Some(Cow::Owned(name)),
                ..MetaArgs::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_as_written() {
        let event = Event::Request {
            name: "read".into(),
            cat: "fuse".into(),
            ts: 12.5,
            dur: 3.25,
            pid: 7,
            tid: 8,
            args: RequestArgs {
                ino: 3,
                path: "/a \"b\"".into(),
                offset: 4096,
                size: 131072,
                bytes: Some(100),
                errno: None,
                tier: Some("ram+source".into()),
            },
        };
        let text = serde_json::to_string(&event).unwrap();
        assert!(text.contains(r#""ph":"X""#), "{text}");
        assert!(!text.contains("errno"), "{text}");
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), event);
    }
}
