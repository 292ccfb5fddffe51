//! The words of `locate`, with nothing below them (so a read's request can keep where its bytes
//! were found without an import cycle): where a byte range is, and how a read fetches what it
//! misses.

/// A byte range located: where its bytes are (`at`), in the outermost image that holds them (an
/// inner archive's bytes are its outer image's: read, cached and staged as those).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Located {
    pub image: u32,
    pub offset: u64,
    pub len: u64,
    pub at: At,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The lookahead's window holds these bytes, or fetches them now (a reader waits for it).
    Window,
    /// Every chunk is staged or in the RAM tier. Asked for the lookahead only: a reader finds
    /// each chunk's tier as it copies it (one lookup per chunk, not two).
    Resident,
    /// Chunk by chunk: from the stage where it holds the chunk, else fetched as `plan` says
    /// (whole chunks through the RAM tier when `plan.chunked`, else exactly).
    Chunks(Plan),
    /// Exactly these bytes from the source, in one read: nothing local can hold them. `file`:
    /// the image is a plain file on a local disk, whose range a reply may splice.
    Source { file: bool },
}

/// How one read fetches the bytes it misses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The stage keeps this image (its chunks may be staged already).
    pub kept: bool,
    /// The stage is copying this image now: chunks are claimed and handed to the stager.
    pub staging: bool,
    /// Whole chunks through the RAM tier; otherwise exactly the bytes asked for.
    pub chunked: bool,
}

impl Plan {
    /// Nothing local can hold these bytes: one read of exactly them, not one per chunk.
    pub fn straight_to_source(&self) -> bool {
        !self.kept && !self.chunked
    }
}

/// Where a sample's bytes are and how to fetch them ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Stored bytes at `start` of `image` (the outermost image), fetched exactly.
    Exact { image: u32, start: u64, len: u64 },
    /// Stored bytes in chunks `first..=last` of `image`, which the chunk room fetches (the
    /// stage copies the image, or every image goes by chunks).
    Chunks { image: u32, first: u64, last: u64 },
    /// Decoded units, decoded into the RAM cache.
    Decode,
    /// Nothing to fetch: local already, or not worth it (empty).
    Resident,
}
