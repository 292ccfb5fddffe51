//! Tests of `placement` (apart, so the module stays one idea a screen).

use super::*;
use crate::archive::codec::Codec;
use crate::archive::squashfs::block_map::{Extent, STORED, Tail};

#[test]
fn stored_and_deflate_are_one_piece() {
    let stored = Placement::Stored {
        at: 512,
        crc: Some(7),
    };
    // Any piece carries the whole file's extent and CRC, for the executor's check.
    let pieces: Vec<_> = stored.plan(100, 10, 20).collect();
    let crc = Some(WholeCrc {
        at: 512,
        len: 100,
        crc: 7,
    });
    assert_eq!(
        pieces,
        [Ok(Piece::Stored {
            at: 522,
            len: 20,
            crc
        })]
    );
    let deflate = Placement::Deflate { at: 40, crc: None };
    let pieces: Vec<_> = deflate.plan(100, 10, 20).collect();
    assert_eq!(
        pieces,
        [Ok(Piece::Decoded {
            unit: Unit::deflate_stream(40, 100, None),
            from: 10,
            len: 20
        })]
    );
}

#[test]
fn squashfs_reads_split_at_blocks() {
    // Blocks of 4 KiB: compressed, sparse, stored; then a tail in a fragment block.
    let mut rec = Vec::new();
    let tail = Tail {
        block: Extent {
            start: 90_000,
            word: 700,
        },
        offset: 100,
    };
    block_map::encode(
        Codec::Zstd,
        12,
        1000,
        &[900, 0, 4096 | STORED],
        Some(tail),
        &mut rec,
    );
    let map = BlockMap::decode(&rec).unwrap();
    let size = 3 * 4096 + 50;
    let pieces: Vec<Piece> = Placement::Squashfs(map)
        .plan(size, 4000, (size - 4000) as usize)
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        pieces,
        [
            Piece::Decoded {
                unit: Unit::block(Codec::Zstd, 1000, 900, 4096),
                from: 4000,
                len: 96
            },
            Piece::Zeros(4096),
            Piece::Stored {
                at: 1900,
                len: 4096,
                crc: None
            },
            Piece::Decoded {
                unit: Unit::fragment_block(Codec::Zstd, 90_000, 700, 150, 4096),
                from: 100,
                len: 50
            },
        ]
    );
    assert_eq!(
        Placement::Squashfs(map).to_string(),
        "zstd blocks 3 at 1000..5996 tail at 90000+100"
    );
}

#[test]
fn units_check_what_they_decode_to() {
    use std::io::Write;
    let plain = vec![3u8; 5000];
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&plain).unwrap();
    let packed = z.finish().unwrap();
    let mut image = vec![0u8; 64];
    image.extend_from_slice(&packed);
    let len = packed.len() as u32;
    assert_eq!(
        Unit::block(Codec::Zlib, 64, len, 5000)
            .decode(&image)
            .unwrap(),
        plain
    );
    let err = Unit::block(Codec::Zlib, 64, len, 4000)
        .decode(&image)
        .unwrap_err();
    assert!(err.to_string().contains("more than 4000"), "{err}");
    let frag = Unit::fragment_block(Codec::Zlib, 64, len, 6000, 8192);
    let err = frag.decode(&image).unwrap_err();
    assert!(
        err.to_string()
            .contains("gzip fragment block decodes to 5000"),
        "{err}"
    );
    let cut = Unit::block(Codec::Zlib, 64, len + 10, 5000)
        .decode(&image)
        .unwrap_err();
    assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof);
}
