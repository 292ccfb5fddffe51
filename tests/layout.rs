//! The layout's rules, checked on the source text (docs/design.md, "Module map"): modules import
//! each other in one direction (no cycle between the crate's top-level modules, nor between the
//! parts of one module); only `fs` knows fuser and only `cli` knows clap; whether an image is a
//! file or an object is told in `source/` alone, and a location is read from its name only there
//! and where an index is read back (`catalog/index/`); `util/` imports nothing else of the crate; the file system's replies choose their errno
//! in `fs/error.rs` alone (the refusals too); no source file is over 600 lines; what a request
//! carries travels in its arguments, never in a thread-local (those hold scratch buffers and
//! decoder state only). An import through a module's re-export (`pub use part::Name` in its
//! `mod.rs`) counts as an import of the part that defines the name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Every `.rs` file under `src/`, with its module path (`src/fs/ring/queue.rs`: fs, ring, queue;
/// a `mod.rs` is its folder's module).
fn sources() -> Vec<(PathBuf, Vec<String>, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            let text = std::fs::read_to_string(&p).unwrap();
            (p, module, text)
        })
        .collect()
}

/// The text of `text` without its comments and string literals' contents (roughly: enough to
/// see paths in code, not in prose).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") { "" } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `code` names through `prefix` (`crate::`, `packfs::`, `super::`), each as the
/// path that follows, braces expanded one level (`crate::{a, b::c}`: a, b).
fn named_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        // Part of a longer name, or the start of a string literal (a test's log target).
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '"') {
            continue;
        }
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let parts: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let after = &rest[path.len()..];
        if after.starts_with('{') {
            let inner = &after[1..after.find('}').unwrap_or(after.len())];
            for item in inner.split(',') {
                let first = item.trim().split("::").next().unwrap_or("").trim();
                if !first.is_empty() && first != "self" {
                    let mut p = parts.clone();
                    p.push(first.to_string());
                    out.push(p);
                }
            }
        } else if !parts.is_empty() {
            out.push(parts);
        }
    }
    out
}

/// A cycle in `edges`, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[from..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if !state.contains_key(n.as_str())
            && let Some(c) = visit(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// What each module's root re-exports from its parts: `fs::FsOptions` -> `fs::options` for
/// `pub use options::{FsOptions, ..}` in `fs/mod.rs` (`self::` and nested paths too).
fn reexports(files: &[(PathBuf, Vec<String>, String)]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for (path, module, text) in files {
        let is_root = path.file_name().is_some_and(|n| n == "mod.rs");
        if !is_root || module.len() != 1 {
            continue;
        }
        let code = code_of(text);
        let mut rest = code.as_str();
        while let Some(at) = rest.find("pub use ") {
            rest = &rest[at + "pub use ".len()..];
            let statement = &rest[..rest.find(';').unwrap_or(rest.len())];
            let statement = statement.trim_start_matches("self::");
            let Some((part, names)) = statement.split_once("::") else {
                continue;
            };
            let names = names.trim().trim_start_matches('{').trim_end_matches('}');
            for name in names.split(',') {
                let name = name.split(" as ").last().unwrap_or("").trim();
                let name = name.rsplit("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    map.insert(
                        format!("{}::{name}", module[0]),
                        format!("{}::{}", module[0], part.trim()),
                    );
                }
            }
        }
    }
    map
}

#[test]
fn modules_import_each_other_in_one_direction() {
    let files = sources();
    let reexported = reexports(&files);
    let tops: BTreeSet<String> = files
        .iter()
        .filter(|(_, m, _)| m.len() > 1 || !["lib", "main"].contains(&m[0].as_str()))
        .map(|(_, m, _)| m[0].clone())
        .collect();
    // Between top-level modules, and between the parts of each (archive::layout ->
    // archive::inflate, fs::classic -> fs::reads...).
    let mut top_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut part_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, text) in &files {
        if !tops.contains(&module[0]) {
            continue;
        }
        let code = code_of(text);
        let mut targets: Vec<Vec<String>> = named_after(&code, "crate::");
        targets.extend(named_after(&code, "packfs::"));
        // `super::x` from a file of module m names m's parent's x.
        for rel in named_after(&code, "super::") {
            let mut t = module[..module.len() - 1].to_vec();
            t.extend(rel);
            targets.push(t);
        }
        for t in targets {
            if t.is_empty() || !tops.contains(&t[0]) {
                continue;
            }
            if t[0] != module[0] {
                top_edges
                    .entry(module[0].clone())
                    .or_default()
                    .insert(t[0].clone());
            } else if module.len() > 1 && t.len() > 1 {
                let part = |m: &[String]| format!("{}::{}", m[0], m[1]);
                let to = part(&t);
                let to = reexported.get(&to).cloned().unwrap_or(to);
                if to != part(module) {
                    part_edges.entry(part(module)).or_default().insert(to);
                }
            }
        }
    }
    assert!(top_edges.len() > 5, "the modules were read: {top_edges:?}");
    assert_eq!(cycle(&top_edges), None, "top-level modules: {top_edges:?}");
    assert_eq!(cycle(&part_edges), None, "parts of one module");
}

#[test]
fn each_concern_stays_in_its_module() {
    let mut broken = Vec::new();
    for (path, module, text) in sources() {
        let code = code_of(&text);
        let shown = path.display();
        let top = module[0].as_str();
        if code.contains("fuser::") && top != "fs" {
            broken.push(format!("{shown}: fuser outside fs/"));
        }
        if code.contains("clap::") && top != "cli" && top != "main" {
            broken.push(format!("{shown}: clap outside cli/"));
        }
        if code.contains("set_var(") && top != "main" {
            broken.push(format!(
                "{shown}: sets an environment variable; pass the value (an engine takes its stores, \
                 `source::Stores`)"
            ));
        }
        // Locations are typed from where they are given (`ImageLocation::from_arg`) or read back
        // from an index on: reading one from its name again elsewhere is the text it was.
        let reads_names =
            top == "source" || module.starts_with(&["catalog".into(), "index".into()]);
        if code.contains("ImageLocation::new(") && !reads_names {
            broken.push(format!(
                "{shown}: reads a location from its name outside source/ and catalog/index/; \
                 carry the ImageLocation"
            ));
        }
        if top == "util" {
            let names_others = ["crate::", "packfs::"].iter().any(|prefix| {
                named_after(&code, prefix)
                    .iter()
                    .any(|path| path.first().is_some_and(|m| m != "util"))
            });
            if names_others {
                broken.push(format!(
                    "{shown}: util/ is the ground floor, and imports nothing else of the crate"
                ));
            }
        }
        if code.contains("is_url") && top != "source" {
            broken.push(format!("{shown}: tells a URL from a path outside source/"));
        }
        // The file system's replies: errnos come from fs::Error or the refusal table. Errnos the
        // kernel hands back (EAGAIN, EINTR from the ring) are results, not answers.
        // The Python module answers as the mount does: through fs::Error too.
        let chooses = module.len() > 1
            && (top == "fs" || top == "python")
            && module[1] != "error"
            && ["libc::E", "Errno::E"].iter().any(|p| {
                code.match_indices(p).any(|(at, _)| {
                    let name: String = code[at + p.len() - 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase())
                        .collect();
                    !["EAGAIN", "EINTR", "ENOSYS", "EFD_CLOEXEC"].contains(&name.as_str())
                        && !name.starts_with("EFD")
                })
            });
        if chooses {
            broken.push(format!("{shown}: chooses an errno outside fs/error.rs"));
        }
        if let Some(cell) = thread_local_cell(&code) {
            broken.push(format!(
                "{shown}: a thread-local `{cell}` carries a value from one call to another; pass \
                 it in the call (a read's context is its `tiers::ReadRequest`)"
            ));
        }
        let lines = text.lines().count();
        if lines > MAX_LINES {
            broken.push(format!("{shown}: {lines} lines (at most {MAX_LINES})"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The process-wide statics that may change (an atomic, a lock, a once-cell: `mutable_statics`)
/// that are allowed, by file and name, each for what is one per process. No mount's state is one
/// of them: two engines live in one process (tests/engine.rs), and the reply room, the stall
/// clock, the budget's waiters, the error log and the network store were globals once.
const PROCESS_WIDE: [(&str, &str, &str); 8] = [
    (
        "source/mapped.rs",
        "MAPPED_CHECKS",
        "whether the process is packfs's own: its signal handlers are the whole process's",
    ),
    (
        "source/mapped.rs",
        "GUARDED",
        "the ranges a SIGBUS handler (the process's) answers for",
    ),
    (
        "source/mapped.rs",
        "BEFORE",
        "the process's SIGBUS action before the guard's",
    ),
    (
        "source/mapped.rs",
        "INSTALL",
        "the SIGBUS guard, installed once per process",
    ),
    (
        "fs/page_cache.rs",
        "NO_CACHESTAT",
        "what the kernel lacks is the same for every mount",
    ),
    (
        "fs/splice.rs",
        "SMALL_PIPE_SAID",
        "a warning about the kernel's pipe limit, said once",
    ),
    (
        "archive/spill.rs",
        "DIR",
        "where `packfs index` puts its temporary tables (no mount)",
    ),
    (
        "archive/inflate/mod.rs",
        "SPACING_SET",
        "the environment's checkpoint spacing, read once",
    ),
];

/// The names of the statics of `code` whose value may change (outside `thread_local!` blocks,
/// whose scratch is each thread's own).
fn mutable_statics(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_thread_local = false;
    for line in code.lines() {
        let t = line.trim_start();
        if t.starts_with("thread_local!") {
            in_thread_local = true;
        }
        if in_thread_local {
            in_thread_local = !line.starts_with('}');
            continue;
        }
        let t = t
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ");
        let Some(rest) = t.strip_prefix("static ") else {
            continue;
        };
        let Some((name, ty)) = rest.split_once(':') else {
            continue;
        };
        let ty = ty.split('=').next().unwrap_or("");
        if ["Atomic", "Mutex", "RwLock", "OnceLock", "Cell", "Condvar"]
            .iter()
            .any(|m| ty.contains(m))
        {
            out.push(name.trim().to_string());
        }
    }
    out
}

#[test]
fn mount_state_is_no_process_global_and_reads_are_located_in_one_place() {
    let mut broken = Vec::new();
    for (path, module, text) in sources() {
        let code = code_of(&text);
        // As the allowances name it: a folder's module is its `mod.rs`.
        let file = match path.ends_with("mod.rs") {
            true => format!("{}/mod.rs", module.join("/")),
            false => module.join("/") + ".rs",
        };
        for name in mutable_statics(&code) {
            if !PROCESS_WIDE
                .iter()
                .any(|(f, n, _)| *f == file && *n == name)
            {
                broken.push(format!(
                    "{file}: `static {name}` may change and is the whole process's; a mount's \
                     state belongs to its engine (`engine::Engine`) or its session"
                ));
            }
        }
        // One locate (tiers/locate.rs): the tier order and the chunk plan are asked there only.
        let locates = module.starts_with(&["tiers".into(), "locate".into()]);
        let plans = module.starts_with(&["tiers".into(), "chunks".into()]);
        if !locates
            && !plans
            && ["chunks.plan(", "chunks().plan(", ".straight_to_source("]
                .iter()
                .any(|c| code.contains(c))
        {
            broken.push(format!(
                "{file}: plans where bytes come from outside tiers/locate.rs; ask \
                 `Images::locate`"
            ));
        }
        // The mount is built in one place: the engine opens the dataset and the tiers.
        if module[0] == "daemon"
            && ["dataset::open(", "tiers::open("]
                .iter()
                .any(|c| code.contains(c))
        {
            broken.push(format!("{file}: builds what `engine::Engine::open` builds"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// A `Cell` (not a `RefCell` of scratch) declared in a `thread_local!` block of `code`.
fn thread_local_cell(code: &str) -> Option<String> {
    let mut rest = code;
    while let Some(at) = rest.find("thread_local!") {
        rest = &rest[at..];
        let block = &rest[..rest.find("\n}").unwrap_or(rest.len())];
        for (i, _) in block.match_indices("Cell<") {
            if !block[..i].ends_with("Ref") {
                let end = block[i..].find('>').map_or(block.len(), |e| i + e + 1);
                return Some(block[i..end].to_string());
            }
        }
        rest = &rest["thread_local!".len()..];
    }
    None
}

#[test]
fn the_checks_see_what_they_look_for() {
    // Each rule, shown a line that breaks it, says so: the tests above cannot pass by reading
    // nothing.
    let named = named_after(
        "use crate::{fs::Core, source};\nuse super::plan::Piece;",
        "crate::",
    );
    assert_eq!(
        named,
        vec![vec!["fs".to_string()], vec!["source".to_string()]]
    );
    let mut edges = BTreeMap::new();
    edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    edges.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(cycle(&edges).is_some());
    assert_eq!(code_of("// crate::x\nlet y = 1;"), "\nlet y = 1;");
    let context = "thread_local! {\n    static READER: Cell<u32> = const { Cell::new(0) };\n}";
    assert_eq!(thread_local_cell(context).as_deref(), Some("Cell<u32>"));
    let scratch = "thread_local! {\n    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };\n}";
    assert_eq!(thread_local_cell(scratch), None);
    let globals = "static ROOM: OnceLock<u64> = OnceLock::new();\nstatic NAMES: [&str; 2] = [\"a\", \"b\"];\nthread_local! {\n    static N: Cell<u8> = Cell::new(0);\n}\npub static DONE: AtomicBool = AtomicBool::new(false);";
    assert_eq!(mutable_statics(globals), ["ROOM", "DONE"]);
    let root = (
        PathBuf::from("src/fs/mod.rs"),
        vec!["fs".to_string()],
        "pub use options::{FsOptions, ReaddirPlus};\npub use self::core::Core;".to_string(),
    );
    let map = reexports(&[root]);
    assert_eq!(
        map.get("fs::ReaddirPlus").map(String::as_str),
        Some("fs::options")
    );
    assert_eq!(map.get("fs::Core").map(String::as_str), Some("fs::core"));
}
