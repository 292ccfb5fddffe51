//! Small utilities every layer may use: little-endian record fields (`le`), sizes as users write
//! them (`size`), files packfs writes
//! without following links (`safe_file`), brace and glob expansion of image arguments (`expand`),
//! and the log's setup (`logging`).

pub mod expand;
pub mod le;
pub mod logging;
pub mod safe_file;
pub mod size;
pub mod userns;
