//! Reading a damaged write-ahead log: a valid log is written (records from the input),
//! then bytes of its segments are overwritten from the input, and the log is opened. The
//! reader must answer `Ok` with a prefix of the records written, or an `InvalidData`
//! error — never panic, hang, or return a record that was not written.

#![no_main]

use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use bfdb::storage::{LOG_BLOCK_BYTES, LogDevice, SimLog};
use bfdb::wal::{self, LogOp, LogOptions};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Damage {
    segment: u8,
    offset: u16,
    bytes: Vec<u8>,
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(records) = u.arbitrary::<Vec<(u8, Vec<u8>, bool)>>() else {
        return;
    };
    let Ok(damage) = u.arbitrary::<Vec<Damage>>() else {
        return;
    };
    let options = LogOptions {
        segment_blocks: 2,
        ..LogOptions::default()
    };
    let device = Arc::new(SimLog::new(1));
    let (log, _) = wal::open(device.clone(), options).unwrap();
    let mut written = Vec::new();
    for (i, (keyspace, key, sync)) in records.iter().take(64).enumerate() {
        let ops = vec![LogOp::Put {
            keyspace: u32::from(*keyspace),
            key: key.clone(),
            value: vec![i as u8; key.len() * 37 % 5000],
        }];
        let seq = log.append(&ops).unwrap();
        written.push((seq, ops));
        if *sync {
            log.wait_durable(seq).unwrap();
        }
    }
    log.flush().unwrap();
    let segments = device.list().unwrap();
    for d in damage.iter().take(8) {
        let Some(&id) = segments.get(usize::from(d.segment) % segments.len().max(1)) else {
            break;
        };
        let len = 3 * LOG_BLOCK_BYTES;
        let at = usize::from(d.offset) % len;
        let n = d.bytes.len().min(len - at);
        device.overwrite(id, at, &d.bytes[..n]);
    }
    match wal::open(device, options) {
        Ok((_, recovered)) => {
            assert!(recovered.records.len() <= written.len());
            for (r, (seq, ops)) in recovered.records.iter().zip(&written) {
                assert_eq!((r.seq, &r.ops), (*seq, ops));
            }
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}"),
    }
});
