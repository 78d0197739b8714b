//! A minimal TensorBoard event-file writer (scalars only), so runs can be watched with
//! `tensorboard --logdir RUN_DIR/tb` without a TensorFlow dependency.
//!
//! Format: TFRecord framing (`len: u64`, `masked_crc32c(len)`, payload, `masked_crc32c(payload)`)
//! around `Event` protobufs (`wall_time` 1, `step` 2, `file_version` 3, `summary` 5 with
//! `value {tag 1, simple_value 2}`), encoded by hand.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// CRC-32C (Castagnoli), bitwise table-free is fast enough for a few hundred bytes a step.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn length_delimited(field: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push((field << 3) | 2);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn event(step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    e.push(0x09); // wall_time: double
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    e.extend_from_slice(&now.to_le_bytes());
    e.push(0x10); // step: int64
    varint(step as u64, &mut e);
    body(&mut e);
    e
}

/// Appends scalar summaries to one event file.
pub struct EventWriter {
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir/events.out.tfevents.<time>.hacpo`.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let path = dir.join(format!("events.out.tfevents.{secs}.hacpo.{}", std::process::id()));
        let file = File::create(&path).map_err(|e| Error::io("create", &path, e))?;
        let mut w = EventWriter { out: BufWriter::new(file) };
        let first = event(0, |e| length_delimited(3, b"brain.Event:2", e));
        w.record(&first)?;
        Ok(w)
    }

    fn record(&mut self, payload: &[u8]) -> Result<()> {
        let len = (payload.len() as u64).to_le_bytes();
        let io = |e| Error::io("write", Path::new("tensorboard events"), e);
        self.out.write_all(&len).map_err(io)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes()).map_err(io)?;
        self.out.write_all(payload).map_err(io)?;
        self.out.write_all(&masked_crc(payload).to_le_bytes()).map_err(io)?;
        Ok(())
    }

    /// Writes `tag = value` at `step`.
    pub fn scalar(&mut self, tag: &str, value: f64, step: u64) -> Result<()> {
        let mut v = Vec::new();
        length_delimited(1, tag.as_bytes(), &mut v);
        v.push(0x15); // simple_value: float
        v.extend_from_slice(&(value as f32).to_le_bytes());
        let mut summary = Vec::new();
        length_delimited(1, &v, &mut summary);
        let e = event(step as i64, |e| length_delimited(5, &summary, e));
        self.record(&e)
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io("write", Path::new("tensorboard events"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }
}
