//! Small utilities every layer may use: little-endian record fields (`le`), sizes as users write
//! them (`size`), files packfs writes
//! without following links (`safe_file`), brace and glob expansion of image arguments (`expand`),
//! the log's setup (`logging`), and thread-local values set for one call (`scoped`).

pub mod expand;
pub mod le;
pub mod logging;
pub mod safe_file;
pub mod scoped;
pub mod size;
