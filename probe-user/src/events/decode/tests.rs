use super::*;

fn call_raw(id: ProbeId) -> RawEvent {
    let mut r = RawEvent::zeroed();
    r.kind = kind::CALL;
    r.probe = id as u16;
    r.pid = 10;
    r.tid = 11;
    r.ts_ns = 100;
    r.ret_ts_ns = 200;
    r.flags = event_flags::HAS_RET;
    r
}

/// The BPF side reads the clock once for probes flagged TIME_AT_ENTRY / TIME_AT_RETURN,
/// at that end only: decoding must date them by that end, or its time would be a copy
/// of the other one's that was never taken.
#[test]
fn one_clock_read_probes_are_dated_at_the_end_they_read() {
    use probe_common::spec_flags as sf;
    let mut checked = 0;
    for def in crate::trace::probes::PROBES.iter() {
        let flags = def.spec.flags;
        let expect = if flags & sf::TIME_AT_ENTRY != 0 {
            100
        } else if flags & sf::TIME_AT_RETURN != 0 {
            200
        } else {
            continue;
        };
        assert!(
            flags & (sf::TIME_AT_ENTRY | sf::TIME_AT_RETURN)
                != sf::TIME_AT_ENTRY | sf::TIME_AT_RETURN,
            "{:?} has both one-clock flags",
            def.id
        );
        // Only calls without data take the pending-stack path that honours the flags.
        assert_eq!(
            flags & (sf::DATA_IS_STRING | sf::DATA_IS_BYTES | sf::NESTED),
            0
        );
        let mut r = call_raw(def.id);
        r.args = [0x7000, 4096, 0, 0, 0, 0];
        r.deref = 0x9000;
        let Some(Decoded::Call(c)) = decode(&r) else {
            panic!("{:?} does not decode", def.id)
        };
        assert_eq!(c.ts_mono, expect, "{:?}", def.id);
        checked += 1;
    }
    // halMemAlloc/Free/Release, aclInit/Finalize, aclrtSetDevice; the CUDA runtime's five
    // allocations, three frees and cudaSetDevice; the driver's cuMemCreate/cuMemRelease.
    assert_eq!(checked, 17);
}

/// A batch record as the BPF side writes it (layout written out here word by word, not
/// through a shared encoder, so a change on one side shows).
fn batch(words: &[u64]) -> Vec<u8> {
    let mut bytes = vec![0u8; BATCH_HEADER];
    bytes[0..2].copy_from_slice(&BATCH_KIND.to_ne_bytes());
    bytes[4..8].copy_from_slice(&(words.len() as u32).to_ne_bytes());
    for w in words {
        bytes.extend_from_slice(&w.to_ne_bytes());
    }
    bytes
}

#[test]
fn batch_calls_unpack_every_layout() {
    let ids = 77u64 | 78 << 32;
    let words = [
        // halMemAlloc: one timestamp, deref, ret 0 in the descriptor, args 1 and 2.
        ids,
        ProbeId::HalMemAlloc as u64 | (event_flags::HAS_RET as u64) << 8 | 0b110 << 16 | 1 << 23,
        500,
        0xdead_0000,
        4096,
        1 << 10,
        // halMemFree failing with -1 (fits an i32: sign-extended), arg 0.
        ids,
        ProbeId::HalMemFree as u64
            | (event_flags::HAS_RET as u64) << 8
            | 1 << 16
            | 0xffff_ffff << 32,
        600,
        0xbeef,
        // Two timestamps, a 64-bit return value in its own word, a deref that faulted,
        // arguments 0 and 5.
        ids,
        9 | ((event_flags::HAS_RET | event_flags::DEREF_FAULT) as u64) << 8
            | 0b100001 << 16
            | 1 << 22
            | 1 << 23
            | 1 << 24,
        700,
        750,
        0,
        0x1_0000_0000,
        11,
        66,
    ];
    let calls: Vec<RawEvent> = batch_calls(&batch(&words)).unwrap().collect();
    assert_eq!(calls.len(), 3);
    let c = &calls[0];
    assert_eq!(
        (c.kind, c.pid, c.tid, c.probe),
        (kind::CALL, 77, 78, ProbeId::HalMemAlloc as u16)
    );
    assert_eq!(
        (c.ts_ns, c.ret_ts_ns, c.ret, c.deref),
        (500, 500, 0, 0xdead_0000)
    );
    assert_eq!(c.args, [0, 4096, 1 << 10, 0, 0, 0]);
    assert_eq!(c.flags, event_flags::HAS_RET);
    let c = &calls[1];
    assert_eq!(
        (c.ts_ns, c.ret_ts_ns, c.ret as i64, c.deref),
        (600, 600, -1, 0)
    );
    assert_eq!(c.args, [0xbeef, 0, 0, 0, 0, 0]);
    let c = &calls[2];
    assert_eq!(c.probe, 9);
    assert_eq!(c.flags, event_flags::HAS_RET | event_flags::DEREF_FAULT);
    assert_eq!(
        (c.ts_ns, c.ret_ts_ns, c.ret, c.deref),
        (700, 750, 0x1_0000_0000, 0)
    );
    assert_eq!(c.args, [11, 0, 0, 0, 0, 66]);

    // A call cut short by the end of the record ends the walk; the whole ones stay.
    let cut = batch(&words[..words.len() - 1]);
    assert_eq!(batch_calls(&cut).unwrap().count(), 2);
    // A word count beyond the bytes sent reads only what is there.
    let mut short = batch(&words);
    short[4..8].copy_from_slice(&400u32.to_ne_bytes());
    assert_eq!(batch_calls(&short).unwrap().count(), 3);
    // Not a batch: a call record, and a runt.
    let mut call = vec![0u8; RAW_HEADER];
    call[0..2].copy_from_slice(&kind::CALL.to_ne_bytes());
    assert!(batch_calls(&call).is_none());
    assert!(batch_calls(&batch(&words)[..4]).is_none());
}

#[test]
fn batched_calls_keep_every_argument_decode_reads() {
    use crate::trace::probes::PROBES;
    let mut narrowed = std::collections::BTreeSet::new();
    for def in PROBES
        .iter()
        .filter(|d| d.spec.kept_args != probe_common::ALL_ARGS)
    {
        narrowed.insert(def.id);
        let mut full = call_raw(def.id);
        full.args = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66];
        full.ret = 5;
        full.deref = 0x7000;
        let mut kept = full;
        for (i, a) in kept.args.iter_mut().enumerate() {
            if def.spec.kept_args & 1 << i == 0 {
                *a = 0;
            }
        }
        assert_eq!(
            decode(&kept),
            decode(&full),
            "{} needs an argument it drops",
            def.symbol
        );
    }
    // halMemAlloc, halMemFree, halMemRelease, aclInit, aclFinalize, aclrtSetDevice,
    // MindSpore's AllocTensorMem, the four VMM calls and MindSpore's task starts; the CUDA
    // runtime's eight memory calls, cudaSetDevice, c10's report and the driver's six virtual
    // memory calls.
    assert_eq!(narrowed.len(), 28);
}

#[test]
fn mindspore_pipeline_tasks() {
    // Push: the task is read through the shared_ptr reference.
    let mut p = call_raw(ProbeId::MsTaskPush);
    p.args = [0x5555_1000, 0x7ffc_0010, 0, 0, 0, 0];
    p.data_len = 8;
    p.data[..8].copy_from_slice(&0x7fff_b800_1ca0u64.to_ne_bytes());
    let Some(Decoded::Call(c)) = decode(&p) else {
        panic!("Push does not decode")
    };
    assert_eq!(
        c.call,
        Call::MsTaskPush {
            task: 0x7fff_b800_1ca0
        }
    );
    // A reference that could not be read names no task.
    p.flags |= event_flags::DATA_FAULT;
    assert_eq!(decode(&p), None);
    let mut r = call_raw(ProbeId::MsTaskRun);
    r.args = [0x7fff_b800_1ca0, 0, 0, 0, 0, 0];
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!("Run does not decode")
    };
    assert_eq!(
        c.call,
        Call::MsTaskRun {
            task: 0x7fff_b800_1ca0
        }
    );
}

#[test]
fn mindspore_pool_calls() {
    let mut r = call_raw(ProbeId::MsAllocTensorMem);
    r.args = [0x5555_0000, 1_049_088, 0, 0, 0, 0];
    r.ret = 0x6000_0000_0200;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!("AllocTensorMem does not decode")
    };
    // Dated at its return, after the driver memory it mapped.
    assert_eq!(c.ts_mono, 200);
    assert_eq!(
        c.call,
        Call::MsPoolAlloc {
            pool: 0x5555_0000,
            size: 1_049_088,
            addr: 0x6000_0000_0200,
            pool_used: None,
            pool_reserved: None,
        }
    );
    // With the pool's counter found (the cookie's upper bits), its value read at the return;
    // none when the read faulted.
    r.cpu = probe_common::read_chain::pack(0xd8, 0, None).unwrap();
    r.deref = 5 << 20;
    let counts = |r: &RawEvent| match decode(r) {
        Some(Decoded::Call(CallEvent {
            call:
                Call::MsPoolAlloc {
                    pool_used,
                    pool_reserved,
                    ..
                },
            ..
        })) => (pool_used, pool_reserved),
        _ => panic!("AllocTensorMem does not decode"),
    };
    // args[5] is a register's leftover when no reserved pair was asked for.
    r.args[probe_common::CHAIN_SUM_ARG] = 0x1234;
    assert_eq!(counts(&r), (Some(5 << 20), None));
    // With the reserved pair too: their sum, in the last argument slot; u64::MAX: unreadable.
    r.cpu = probe_common::read_chain::pack(0xd8, 0, Some((0x18, 0x10))).unwrap();
    r.args[probe_common::CHAIN_SUM_ARG] = 1 << 30;
    assert_eq!(counts(&r), (Some(5 << 20), Some(1 << 30)));
    r.args[probe_common::CHAIN_SUM_ARG] = u64::MAX;
    assert_eq!(counts(&r), (Some(5 << 20), None));
    r.flags |= event_flags::DEREF_FAULT;
    assert_eq!(counts(&r).0, None);
    let mut f = call_raw(ProbeId::MsFreeTensorMem);
    f.args = [0x5555_0000, 0x7ffc_0000, 0, 0, 0, 0];
    f.data_len = 8;
    f.data[..8].copy_from_slice(&0x6000_0000_0200u64.to_ne_bytes());
    // A C++ bool: the upper bytes of the return register are whatever was there.
    for (ret, freed) in [(0x1234_5601, true), (0x1234_5600, false)] {
        f.ret = ret;
        let Some(Decoded::Call(c)) = decode(&f) else {
            panic!("DoFreeTensorMem does not decode")
        };
        assert_eq!(
            c.call,
            Call::MsPoolFree {
                pool: 0x5555_0000,
                addr: 0x6000_0000_0200,
                freed,
                pool_used: None,
                pool_reserved: None,
            }
        );
    }
    // The reference could not be read: no free is made up.
    f.flags |= event_flags::DATA_FAULT;
    assert!(decode(&f).is_none());
}

#[test]
fn alloc_uses_return_time_and_out_pointer() {
    let mut r = call_raw(ProbeId::HalMemAlloc);
    r.args = [0x7000, 4096, 1 | (1 << 10), 0, 0, 0];
    r.deref = 0x12c0_0000_0000;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(c.ts_mono, 200);
    assert_eq!(
        c.call,
        Call::HalAlloc {
            size: 4096,
            flag: 1 | (1 << 10),
            ret: 0,
            addr: Some(0x12c0_0000_0000)
        }
    );
    r.flags |= event_flags::DEREF_FAULT;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert!(matches!(c.call, Call::HalAlloc { addr: None, .. }));
}

#[test]
fn free_uses_entry_time_and_negative_codes_survive() {
    let mut r = call_raw(ProbeId::HalMemFree);
    r.args[0] = 0xabc;
    r.ret = (-1i64) as u64;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(c.ts_mono, 100);
    assert_eq!(
        c.call,
        Call::HalFree {
            addr: 0xabc,
            ret: -1
        }
    );
}

#[test]
fn mark_text_and_short_records() {
    let mut r = call_raw(ProbeId::MstxMarkA);
    r.flags = 0;
    r.data[..5].copy_from_slice(b"hello");
    r.data_len = 5;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(
        c.call,
        Call::Mark {
            text: "hello".into()
        }
    );
    assert!(raw_from_bytes(&[0u8; 16]).is_none());
    let mut unknown = r;
    unknown.probe = 999;
    assert!(decode(&unknown).is_none());
    // A return-probe call that arrived without its return is not trusted.
    let mut half = call_raw(ProbeId::HalMemAlloc);
    half.flags = 0;
    assert!(decode(&half).is_none());
}

#[test]
fn atb_strings_and_tensor_chunks() {
    let mut r = call_raw(ProbeId::AtbRunnerName);
    r.flags = 0;
    r.args[0] = 0x1000;
    r.args[1] = 0x2000;
    // 16 bytes of the runner (vtable, name pointer), then the name with its NUL.
    r.data[16..23].copy_from_slice(b"Linear\0");
    r.data_len = 23;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(
        c.call,
        Call::Atb {
            object: 0x1000,
            pack: 0x2000,
            event: AtbEvent::Name("Linear".into())
        }
    );
    assert_eq!(c.ts_mono, 100);
    r.flags = event_flags::DATA_FAULT;
    assert!(decode(&r).is_none());

    let mut chunk = call_raw(ProbeId::AtbOutAfter);
    chunk.kind = kind::CHUNK;
    chunk.args = [0x1000, 0x2000, 3, 2, 1, 0];
    let t = &mut chunk.data[..104];
    t[0..4].copy_from_slice(&1i32.to_ne_bytes());
    t[4..8].copy_from_slice(&29i32.to_ne_bytes());
    t[8..16].copy_from_slice(&2i64.to_ne_bytes());
    t[16..24].copy_from_slice(&8i64.to_ne_bytes());
    t[72..80].copy_from_slice(&2u64.to_ne_bytes());
    t[80..88].copy_from_slice(&0x12c0_0000_0100u64.to_ne_bytes());
    t[96..104].copy_from_slice(&64u64.to_ne_bytes());
    chunk.data_len = 104;
    let Some(Decoded::Call(c)) = decode(&chunk) else {
        panic!()
    };
    let tensor = AtbTensor {
        addr: 0x12c0_0000_0100,
        size: 64,
        dtype: 1,
        format: 29,
        shape: vec![2, 8],
    };
    assert_eq!(tensor.attr(), "dtype:1,format:29,shape:[2,8,]");
    assert_eq!(
        c.call,
        Call::Atb {
            object: 0x1000,
            pack: 0x2000,
            event: AtbEvent::Tensors {
                output: true,
                after: true,
                tensors: vec![tensor],
                first: 2
            }
        }
    );
    // After tensors are read at the return.
    assert_eq!(c.ts_mono, 200);
    assert!(c.at_return);
}

#[test]
fn cuda_calls() {
    // cudaMalloc(&p, 2 MiB) = 0: *p read at return, dated at return.
    let mut r = call_raw(ProbeId::CudaMalloc);
    r.args[1] = 2 << 20;
    r.deref = 0x7f00_0000_0000;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(
        (c.call, c.ts_mono),
        (
            Call::CudaAlloc {
                api: ProbeId::CudaMalloc,
                size: 2 << 20,
                ret: 0,
                addr: Some(0x7f00_0000_0000)
            },
            200
        )
    );
    // cudaFreeHost(p) = 0, dated at entry.
    let mut r = call_raw(ProbeId::CudaFreeHost);
    r.args[0] = 0x5000;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(c.ts_mono, 100);
    assert!(matches!(c.call, Call::CudaFree { addr: 0x5000, .. }));
    // c10's report: a block of 512 bytes freed on cuda:2 (entry only).
    let mut r = call_raw(ProbeId::C10ReportMemoryUsage);
    r.flags = 0;
    r.args = [0x9000, (-512i64) as u64, 0, 1 << 21, 1 | 2 << 8, 0];
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    let Call::C10Usage(u) = c.call else { panic!() };
    assert_eq!(
        (u.ptr, u.size, u.device_index, u.reserved),
        (0x9000, -512, 2, 1 << 21)
    );
    // NVTX: the pushed message (a call with its return), and a pop (entry only).
    let mut r = call_raw(ProbeId::NvtxRangePushA);
    r.data[..10].copy_from_slice(b"step start");
    r.data_len = 10;
    let Some(Decoded::Call(c)) = decode(&r) else {
        panic!()
    };
    assert_eq!(
        c.call,
        Call::RangePush {
            text: "step start".into()
        }
    );
    let mut r = call_raw(ProbeId::NvtxRangePop);
    r.flags = 0;
    assert!(matches!(
        decode(&r),
        Some(Decoded::Call(CallEvent {
            call: Call::RangePop,
            ..
        }))
    ));
}
