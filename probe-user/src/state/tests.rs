use super::DeviceKey;
use super::*;
use crate::events::decode::Call;
use crate::events::hal::DrvMemProp;

fn opts() -> TrackOptions {
    TrackOptions {
        dump: EventSet {
            alloc: true,
            free: true,
            launch: false,
            access: false,
        },
        devices: DeviceFilter {
            all_npu: true,
            npu_mask: 0,
            cpu: true,
        },
        steps: StepFilter::default(),
        step_analyses: true,
        oom_top_k: Some(2),
        decompose: false,
        inefficient: true,
        write_op_launch: true,
        write_kernel_launch: true,
        row_attrs: true,
    }
}

fn ev(tid: u32, call: Call) -> CallEvent {
    CallEvent {
        pid: 100,
        tid,
        ts_mono: 0,
        call,
        at_return: false,
    }
}

#[test]
fn malloc_free_rows_carry_ids_sizes_and_used() {
    let mut p = ProcessState::new(100);
    let o = opts();
    let flag = 1 | (1 << 10) | (1 << 17) | (33u64 << 56);
    let r = p.apply(
        &ev(
            7,
            Call::HalAlloc {
                size: 4096,
                flag,
                ret: 0,
                addr: Some(0xa000),
            },
        ),
        10,
        &o,
        None,
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].device, DeviceKey::Npu(1));
    assert_eq!(
        r[0].attr,
        "allocation_id:1,addr:0x000000000000a000,size:4096,used:4096,page_type:huge,alloc_type:alloc"
    );
    p.apply(
        &ev(
            7,
            Call::HalAlloc {
                size: 100,
                flag: 1 | (1 << 10),
                ret: 0,
                addr: Some(0xb000),
            },
        ),
        11,
        &o,
        None,
    );
    let r = p.apply(
        &ev(
            8,
            Call::HalFree {
                addr: 0xa000,
                ret: 0,
            },
        ),
        12,
        &o,
        None,
    );
    assert_eq!(r[0].event, "FREE");
    assert_eq!(r[0].tid, 8);
    assert_eq!(
        r[0].attr,
        "allocation_id:1,addr:0x000000000000a000,size:4096,used:100"
    );
    // Unknown and failed frees write nothing but are counted.
    assert!(
        p.apply(
            &ev(
                8,
                Call::HalFree {
                    addr: 0xdead,
                    ret: 0
                }
            ),
            13,
            &o,
            None
        )
        .is_empty()
    );
    assert!(
        p.apply(
            &ev(
                8,
                Call::HalFree {
                    addr: 0xb000,
                    ret: 1
                }
            ),
            13,
            &o,
            None
        )
        .is_empty()
    );
    assert!(
        p.apply(
            &ev(
                8,
                Call::HalAlloc {
                    size: 1,
                    flag: 0,
                    ret: 1,
                    addr: Some(0)
                }
            ),
            13,
            &o,
            None
        )
        .is_empty()
    );
    assert_eq!(p.stats.unmatched_frees, 1);
    assert_eq!(p.stats.failed_frees, 1);
    assert_eq!(p.stats.failed_allocs, 1);
    assert_eq!(p.live_blocks().len(), 1);
}

#[test]
fn host_create_steps_and_marks() {
    let mut p = ProcessState::new(100);
    let o = opts();
    let r = p.apply(
        &ev(
            1,
            Call::RangeStart {
                text: "step start".into(),
                id: 5,
            },
        ),
        1,
        &o,
        None,
    );
    assert_eq!(r[0].name, "\"step start\"");
    assert_eq!(r[0].device, DeviceKey::NotApplicable);
    p.apply(&ev(1, Call::SetDevice { device: 3, ret: 0 }), 1, &o, None);
    let r = p.apply(
        &ev(
            1,
            Call::Mark {
                text: "=cmd".into(),
            },
        ),
        2,
        &o,
        None,
    );
    assert_eq!((&*r[0].name, r[0].device), ("\"\"", DeviceKey::Npu(3)));
    let r = p.apply(
        &ev(
            1,
            Call::HalAlloc {
                size: 64,
                flag: 2 << 10,
                ret: 0,
                addr: Some(0x55),
            },
        ),
        3,
        &o,
        None,
    );
    assert_eq!((r[0].event_type, r[0].device), ("HOST", DeviceKey::Cpu));
    assert_eq!(
        r[0].attr,
        "allocation_id:1,addr:0x0000000000000055,size:64,pinned:true,used:64"
    );
    let prop = DrvMemProp {
        side: 0,
        devid: 2,
        module_id: 7,
        pg_type: 2,
        mem_type: 0,
    };
    let r = p.apply(
        &ev(
            1,
            Call::HalCreate {
                size: 8,
                flag: 0,
                prop: Some(prop),
                ret: 0,
                handle: Some(0x77),
            },
        ),
        4,
        &o,
        None,
    );
    assert!(r[0].attr.ends_with("page_type:giant,alloc_type:create"));
    assert_eq!(r[0].device, DeviceKey::Npu(2));
    let r = p.apply(&ev(1, Call::RangeEnd { id: 5 }), 5, &o, None);
    assert_eq!(r[0].name, "\"Range end from id 5\"");
    let live = p.live_blocks();
    assert_eq!(live.len(), 2);
    assert!(live.iter().all(|b| b.step == 1));
    let r = p.apply(
        &ev(
            1,
            Call::HalRelease {
                handle: 0x77,
                ret: 0,
            },
        ),
        6,
        &o,
        None,
    );
    assert_eq!(r[0].event, "FREE");
    assert_eq!(p.stats.releases, 1);
}

#[test]
fn device_filter_and_dump_filter() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.devices = DeviceFilter {
        all_npu: false,
        npu_mask: 1 << 2,
        cpu: false,
    };
    assert!(
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 1,
                    flag: 1 | (1 << 10),
                    ret: 0,
                    addr: Some(1)
                }
            ),
            1,
            &o,
            None
        )
        .is_empty()
    );
    assert!(
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 1,
                    flag: 2 << 10,
                    ret: 0,
                    addr: Some(2)
                }
            ),
            1,
            &o,
            None
        )
        .is_empty()
    );
    assert_eq!(p.stats.filtered, 2);
    // The frees of blocks left out are left out too, not counted as unknown frees.
    assert!(
        p.apply(&ev(1, Call::HalFree { addr: 2, ret: 0 }), 1, &o, None)
            .is_empty()
    );
    assert_eq!((p.stats.filtered, p.stats.unmatched_frees), (3, 0));
    assert_eq!(
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 1,
                    flag: 2 | (1 << 10),
                    ret: 0,
                    addr: Some(3)
                }
            ),
            1,
            &o,
            None
        )
        .len(),
        1
    );
    o.dump.alloc = false;
    assert!(
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 1,
                    flag: 2 | (1 << 10),
                    ret: 0,
                    addr: Some(4)
                }
            ),
            1,
            &o,
            None
        )
        .is_empty()
    );
    assert_eq!(p.live_blocks().len(), 2, "collected even when not written");
}

#[test]
fn reused_live_address_closes_the_old_block() {
    let mut p = ProcessState::new(100);
    let o = opts();
    p.apply(
        &ev(
            1,
            Call::HalAlloc {
                size: 10,
                flag: 1 << 10,
                ret: 0,
                addr: Some(0x10),
            },
        ),
        1,
        &o,
        None,
    );
    let r = p.apply(
        &ev(
            1,
            Call::HalAlloc {
                size: 20,
                flag: 1 << 10,
                ret: 0,
                addr: Some(0x10),
            },
        ),
        2,
        &o,
        None,
    );
    assert_eq!(
        r.iter().map(|r| r.event).collect::<Vec<_>>(),
        ["FREE", "MALLOC"]
    );
    assert!(r[1].attr.contains("used:20"));
    assert_eq!(p.stats.double_mallocs, 1);
}

#[test]
fn step_filter_keeps_only_listed_steps_with_their_own_range_rows() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.steps = StepFilter::new(&[2]);
    let alloc = |p: &mut ProcessState, addr| {
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 1,
                    flag: 1 << 10,
                    ret: 0,
                    addr: Some(addr),
                },
            ),
            1,
            &o,
            None,
        )
        .len()
    };
    assert_eq!(alloc(&mut p, 1), 0, "before any step");
    for (step, id) in [(1u64, 10u64), (2, 11), (3, 12)] {
        let start = p.apply(
            &ev(
                1,
                Call::RangeStart {
                    text: "step start".into(),
                    id,
                },
            ),
            1,
            &o,
            None,
        );
        let inside = alloc(&mut p, 100 + step);
        let end = p.apply(&ev(1, Call::RangeEnd { id }), 1, &o, None);
        let kept = step == 2;
        assert_eq!(
            (start.len(), inside, end.len()),
            if kept { (1, 1, 1) } else { (0, 0, 0) }
        );
    }
    assert_eq!(alloc(&mut p, 2), 0, "after the step");
    assert_eq!(p.live_blocks().len(), 5, "every block is still tracked");
}

#[test]
fn oom_reports_trigger_recent_and_largest_blocks_throttled() {
    let mut p = ProcessState::new(100);
    let o = opts(); // oom top-K 2
    let alloc = |p: &mut ProcessState, addr: u64, size: u64, ts: u64, stack: &str| {
        let call = Call::HalAlloc {
            size,
            flag: 1 << 10,
            ret: 0,
            addr: Some(addr),
        };
        p.apply(&ev(1, call), ts, &o, Some(std::sync::Arc::from(stack)));
    };
    alloc(&mut p, 0x1000, 100, 1, "s1");
    alloc(&mut p, 0x2000, 300, 2, "s2");
    alloc(&mut p, 0x3000, 200, 3, "s3");
    let fail = Call::HalAlloc {
        size: 999,
        flag: 1 << 10,
        ret: 6,
        addr: None,
    };
    let rows = p.apply(
        &ev(1, fail.clone()),
        5_000,
        &o,
        Some(std::sync::Arc::from("oom-stack")),
    );
    let kinds: Vec<_> = rows.iter().map(|r| (r.event_type, &*r.name)).collect();
    assert_eq!(
        kinds,
        [
            ("OOM_TRIGGER", "OOM_Trigger"),
            ("OOM_RECENT_ALLOC", "OOM_RecentAlloc"),
            ("OOM_RECENT_ALLOC", "OOM_RecentAlloc"),
            ("OOM_TOP_ALLOC", "OOM_TopAlloc"),
            ("OOM_TOP_ALLOC", "OOM_TopAlloc"),
        ]
    );
    assert_eq!(
        rows[0].attr,
        format!("func:halMemAlloc,req_size:999,flag:{}", 1 << 10)
    );
    assert_eq!(rows[0].c_stack.as_deref(), Some("oom-stack"));
    // Most recent first: 0x3000 then 0x2000; largest first: 0x2000 then 0x3000.
    assert_eq!(
        rows[1].attr,
        "pool:HAL,ptr:0x0000000000003000,size:200,timestamp:3"
    );
    assert_eq!(
        rows[2].attr,
        "pool:HAL,ptr:0x0000000000002000,size:300,timestamp:2"
    );
    assert_eq!(
        rows[3].attr,
        "pool:HAL,ptr:0x0000000000002000,size:300,timestamp:2"
    );
    assert_eq!(
        rows[4].attr,
        "pool:HAL,ptr:0x0000000000003000,size:200,timestamp:3"
    );
    assert_eq!(
        rows[1].c_stack.as_deref(),
        Some("s3"),
        "the allocation's stack"
    );
    // Within 2 s: only the trigger; after: the details again.
    assert_eq!(
        p.apply(&ev(1, fail.clone()), 1_000_000_000, &o, None).len(),
        1
    );
    assert_eq!(p.apply(&ev(1, fail), 2_000_005_000, &o, None).len(), 5);
    assert_eq!(p.stats.ooms, 3);
    // Other failures are not OOM.
    let other = Call::HalAlloc {
        size: 1,
        flag: 0,
        ret: 1,
        addr: None,
    };
    assert!(p.apply(&ev(1, other), 9_000_000_000, &o, None).is_empty());
}

#[test]
fn decompose_labels_owners_and_adds_up_per_layer() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.decompose = true;
    let hal = |flag: u64, size, addr| Call::HalAlloc {
        size,
        flag,
        ret: 0,
        addr: Some(addr),
    };
    let r = p.apply(
        &ev(1, hal((1 << 10) | (3u64 << 56), 4096, 0x10)),
        1,
        &o,
        None,
    );
    assert!(
        r[0].attr
            .contains(",used:4096,owner:CANN@HCCL,page_type:normal"),
        "{}",
        r[0].attr
    );
    p.apply(
        &ev(1, hal((1 << 10) | (200u64 << 56), 100, 0x20)),
        2,
        &o,
        None,
    );
    p.apply(
        &ev(
            1,
            Call::DomainCreate {
                name: "ptaCaching".into(),
                handle: 7,
            },
        ),
        3,
        &o,
        None,
    );
    let region = crate::events::decode::RegionDesc {
        device: 0,
        ptr: 0x10,
        size: 1000,
        handle: 0,
    };
    let r = p.apply(
        &ev(
            1,
            Call::RegionsRegister {
                domain: 7,
                regions: vec![region],
                first: 0,
                total: 1,
            },
        ),
        4,
        &o,
        None,
    );
    assert!(r[0].attr.ends_with(",owner:PTA"), "{}", r[0].attr);
    p.apply(&ev(1, Call::HalFree { addr: 0x20, ret: 0 }), 5, &o, None);
    let owners = p.decompose.owners();
    assert_eq!(owners["CANN@HCCL"].current, 4096);
    assert_eq!(
        (owners["CANN@UNKNOWN"].current, owners["CANN@UNKNOWN"].peak),
        (0, 100)
    );
    assert_eq!(owners["PTA"].current, 1000);
    // Each layer adds up: driver owners to the live driver blocks, pools to their regions.
    let driver: u64 = owners
        .iter()
        .filter(|(k, _)| k.starts_with("CANN@"))
        .map(|(_, v)| v.current)
        .sum();
    assert_eq!(driver, p.live_blocks().iter().map(|b| b.size).sum::<u64>());
}

#[test]
fn labels_ops_tag_and_addr_relabel_move_bytes_between_owners() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.decompose = true;
    let mark = |text: &str| Call::Mark { text: text.into() };
    let region = |ptr, size| crate::events::decode::RegionDesc {
        device: 0,
        ptr,
        size,
        handle: 0,
    };
    let register = |r: Vec<crate::events::decode::RegionDesc>| Call::RegionsRegister {
        domain: 7,
        regions: r,
        first: 0,
        total: 1,
    };
    let mut t = 0;
    let mut apply = |p: &mut ProcessState, tid, call| {
        t += 1;
        p.apply(&ev(tid, call), t, &o, None)
    };
    apply(
        &mut p,
        1,
        Call::DomainCreate {
            name: "ptaCaching".into(),
            handle: 7,
        },
    );
    apply(&mut p, 1, mark("memscope-label-push: level=1;label=vllm"));
    apply(
        &mut p,
        1,
        mark("memscope-label-push: level=3;label=weights"),
    );
    // Another thread's labels do not apply to thread 1, and vice versa.
    apply(&mut p, 2, mark("memscope-label-push: level=5;label=mine"));
    let r = apply(&mut p, 1, register(vec![region(0x1000, 100)]));
    assert!(
        r[0].attr.ends_with(",owner:PTA@vllm@weights"),
        "{}",
        r[0].attr
    );
    let r = apply(&mut p, 2, register(vec![region(0x2000, 50)]));
    assert!(r[0].attr.ends_with(",owner:PTA@mine"), "{}", r[0].attr);
    apply(&mut p, 1, mark("memscope-label-pop: level=3;label=weights"));
    apply(&mut p, 1, mark("memscope-label-pop: level=1;label=vllm"));
    let r = apply(&mut p, 1, register(vec![region(0x3000, 10)]));
    assert!(r[0].attr.ends_with(",owner:PTA"), "{}", r[0].attr);
    // Label marks are neither MSTX rows nor counted as marks.
    assert_eq!(p.stats.marks, 0);

    // An ATen access tags DETAIL_2 "ops" when it is empty; a second one changes nothing.
    let access = |ptr: u64| {
        mark(&format!(
            "memscope-aten-ac:ptr={ptr};is_write=True;is_read=False;is_output=True;name=op;shape=[1];dtype=torch.float16;tensor_size=2;device=npu:0"
        ))
    };
    apply(&mut p, 1, access(0x3004));
    apply(&mut p, 1, access(0x3004));
    apply(&mut p, 1, access(0x1000));
    // describe_addr: relabel the block holding 0x2010 at level 4, over the weak tag's level.
    apply(
        &mut p,
        1,
        mark("memscope-label-addr: ptr=0x2010;level=4;label=kv"),
    );
    apply(
        &mut p,
        1,
        mark("memscope-label-addr: ptr=0x9999;level=4;label=x"),
    );
    apply(&mut p, 1, mark("memscope-label-push: level=9;label=x"));
    assert_eq!(p.messages.len(), 2, "{:?}", p.messages);
    let owners = p.decompose.owners();
    let cur = |k: &str| owners.get(k).map(|b| (b.current, b.peak));
    assert_eq!(cur("PTA@vllm@weights@ops"), Some((100, 100)));
    assert_eq!(cur("PTA@vllm@weights"), Some((0, 100)));
    assert_eq!(cur("PTA@ops"), Some((10, 10)));
    assert_eq!(cur("PTA"), Some((0, 10)));
    assert_eq!(cur("PTA@kv@mine"), Some((50, 50)));
    // The owners still add up to the live pool memory.
    let live: u64 = owners.values().map(|b| b.current).sum();
    assert_eq!(live, 160);
}

#[test]
fn runtime_launches_inside_an_aclrt_launch_are_not_counted_twice() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.dump.launch = true;
    let launch = |api, duration_ns| Call::KernelLaunch {
        api,
        kernel: 0x40,
        tiling_key: None,
        stream: 0x99,
        name: Some("k".into()),
        duration_ns,
    };
    let acl = launch(
        crate::trace::probes::ProbeId::AclrtLaunchKernelWithConfig,
        Some(100),
    );
    let rt = launch(
        crate::trace::probes::ProbeId::RtKernelLaunchWithHandleV2,
        None,
    );
    let mut rows = Vec::new();
    rows.extend(p.apply(&ev(1, acl.clone()), 1000, &o, None));
    // Inside the aclrt* call on its thread: its own runtime launch.
    rows.extend(p.apply(&ev(1, rt.clone()), 1050, &o, None));
    rows.extend(p.apply(&ev(1, rt.clone()), 1100, &o, None));
    // Another thread at the same time, and the same thread afterwards: real launches.
    rows.extend(p.apply(&ev(2, rt.clone()), 1060, &o, None));
    rows.extend(p.apply(&ev(1, rt), 1101, &o, None));
    assert_eq!(rows.len(), 3);
    assert_eq!(p.stats.launches, 3);
    assert_eq!(p.stats.nested_launches, 2);
    let tasks: Vec<&str> = rows.iter().map(|r| r.attr.as_str()).collect();
    assert_eq!(
        tasks,
        [
            "streamId:0,taskId:0",
            "streamId:0,taskId:1",
            "streamId:0,taskId:2"
        ]
    );
}

#[test]
fn atb_operators_and_accesses_feed_their_own_inefficient_analysis() {
    use crate::events::decode::{AtbEvent, AtbTensor, RegionDesc, RegionRef};
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.dump.access = true;
    let mut t = 0;
    let mut apply = |p: &mut ProcessState, call| {
        t += 1;
        p.apply(&ev(1, call), t, &o, None)
    };
    let atb = |object, event| Call::Atb {
        object,
        pack: object * 10,
        event,
    };
    let region = |ptr| RegionDesc {
        device: 0,
        ptr,
        size: 64,
        handle: 0,
    };
    let tensor = |addr| AtbTensor {
        addr,
        size: 16,
        dtype: 1,
        format: 2,
        shape: vec![4, 2],
    };
    apply(
        &mut p,
        Call::DomainCreate {
            name: "atb".into(),
            handle: 8,
        },
    );
    apply(
        &mut p,
        Call::HeapRegister {
            domain: 8,
            heap: 0x77,
            range: Some(RegionDesc {
                device: 0,
                ptr: 0x1000,
                size: 0x10000,
                handle: 0,
            }),
        },
    );
    let start = |p: &mut ProcessState,
                 apply: &mut dyn FnMut(&mut ProcessState, Call) -> Vec<Row>,
                 runner: u64| {
        apply(p, atb(runner, AtbEvent::Name(format!("op{runner}"))));
        apply(p, atb(runner, AtbEvent::Dir("d".into())));
        apply(
            p,
            atb(
                runner,
                AtbEvent::Pack {
                    workspace: 0,
                    workspace_size: 0,
                },
            ),
        )
    };
    let uses = |runner, addr| {
        atb(
            runner,
            AtbEvent::Tensors {
                output: false,
                after: false,
                tensors: vec![tensor(addr)],
                first: 0,
            },
        )
    };
    let register = |ptr| Call::RegionsRegister {
        domain: 8,
        regions: vec![region(ptr)],
        first: 0,
        total: 1,
    };
    let unregister = |ptr| Call::RegionsUnregister {
        domain: 8,
        refs: vec![RegionRef::Pointer(ptr)],
        first: 0,
        total: 1,
    };
    // op 1 allocates A (0x1000) and B (0x2000) and uses B.
    let r = start(&mut p, &mut apply, 1);
    assert_eq!(r[0].event_type, "ATB_START");
    apply(&mut p, register(0x1000));
    apply(&mut p, register(0x2000));
    let r = apply(&mut p, uses(1, 0x2008));
    assert_eq!(
        r[0].attr,
        "allocation_id:2,addr:0x0000000000002000,size:64,type:ATB,dtype:1,format:2,shape:[4,2,]"
    );
    assert_eq!(
        apply(&mut p, atb(1, AtbEvent::End))[0].event_type,
        "ATB_END"
    );
    // op 2 frees B; op 3 first uses A: early allocation of A.
    start(&mut p, &mut apply, 2);
    apply(&mut p, unregister(0x2000));
    apply(&mut p, atb(2, AtbEvent::End));
    start(&mut p, &mut apply, 3);
    apply(&mut p, uses(3, 0x1000));
    apply(&mut p, atb(3, AtbEvent::End));
    let r = apply(&mut p, unregister(0x1000));
    assert!(
        r[0].attr.ends_with(",inefficient_type:early_allocation"),
        "{}",
        r[0].attr
    );
    assert_eq!(
        p.inefficient_blocks(),
        vec![(1, "early_allocation".to_string())]
    );
    // The PTA analysis saw none of it.
    assert_eq!(p.inefficient.flagged().count(), 0);
    assert_eq!((p.stats.ops, p.stats.accesses), (3, 2));
}

#[test]
fn aten_marks_give_op_and_access_rows_and_feed_inefficient() {
    let mut p = ProcessState::new(100);
    let mut o = opts();
    o.dump.access = true;
    let mark =
        |p: &mut ProcessState, t: &str| p.apply(&ev(1, Call::Mark { text: t.into() }), 1, &o, None);
    let region = |ptr, size| crate::events::decode::RegionDesc {
        device: 0,
        ptr,
        size,
        handle: 0,
    };
    let reg = |p: &mut ProcessState, ptr, size| {
        p.apply(
            &ev(
                1,
                Call::RegionsRegister {
                    domain: 7,
                    regions: vec![region(ptr, size)],
                    first: 0,
                    total: 1,
                },
            ),
            1,
            &o,
            None,
        )
    };
    let unreg = |p: &mut ProcessState, ptr| {
        p.apply(
            &ev(
                1,
                Call::RegionsUnregister {
                    domain: 7,
                    refs: vec![crate::events::decode::RegionRef::Pointer(ptr)],
                    first: 0,
                    total: 1,
                },
            ),
            1,
            &o,
            None,
        )
    };
    p.apply(
        &ev(
            1,
            Call::DomainCreate {
                name: "ptaCaching".into(),
                handle: 7,
            },
        ),
        1,
        &o,
        None,
    );
    let b = "memscope-aten-b: name=torch._ops.aten.addmm.default";
    let e = "memscope-aten-e: name=torch._ops.aten.addmm.default";
    let ac = |ptr: u64, w: &str| {
        format!(
            "memscope-aten-ac:ptr={ptr};is_write={w};is_read=True;is_output=False;name=torch._ops.aten.addmm.default;shape=torch.Size([2, 4]);dtype=torch.float16;tensor_size=16;device=npu:0"
        )
    };
    // op 1 allocates blocks A (0x1000) and B (0x2000) and uses B.
    let r = mark(&mut p, b);
    assert_eq!(
        (r[0].event, r[0].event_type, &*r[0].name),
        ("OP_LAUNCH", "ATEN_START", "torch._ops.aten.addmm.default")
    );
    reg(&mut p, 0x1000, 64);
    reg(&mut p, 0x2000, 64);
    let r = mark(&mut p, &ac(0x2000 + 8, "False"));
    assert_eq!((r[0].event, r[0].event_type), ("ACCESS", "READ"));
    assert_eq!(r[0].ptr, Some(0x2008));
    assert_eq!(
        r[0].attr,
        "allocation_id:2,addr:0x0000000000002000,size:64,type:PTA,dtype:torch.float16,shape:torch.Size([2, 4])"
    );
    assert_eq!(mark(&mut p, e)[0].event_type, "ATEN_END");
    // op 2 frees B; op 3 first uses A: early allocation of A.
    mark(&mut p, b);
    unreg(&mut p, 0x2000);
    mark(&mut p, e);
    mark(&mut p, b);
    assert_eq!(mark(&mut p, &ac(4096, "True"))[0].event_type, "WRITE");
    mark(&mut p, e);
    let r = unreg(&mut p, 0x1000);
    assert!(
        r[0].attr.ends_with(",inefficient_type:early_allocation"),
        "{}",
        r[0].attr
    );
    assert_eq!(
        p.inefficient_blocks(),
        vec![(1, "early_allocation".to_string())]
    );
    assert_eq!((p.stats.ops, p.stats.accesses, p.stats.marks), (3, 2, 0));
    // An access outside every live block is counted, not written.
    assert!(mark(&mut p, &ac(0x9000, "True")).is_empty());
    assert_eq!(p.stats.unmatched_accesses, 1);
}

/// The node agent turns `row_attrs` off: its MALLOC and FREE rows carry the size as a number
/// and no Attr text; everything else about the rows stays as the files have it.
#[test]
fn rows_without_attr_text_carry_the_same_sizes() {
    use crate::events::decode::{RegionDesc, RegionRef};
    let calls = [
        Call::HalAlloc {
            size: 4096,
            flag: 1 | (1 << 10),
            ret: 0,
            addr: Some(0xa000),
        },
        // The same address again: its missed free is closed with a synthetic FREE.
        Call::HalAlloc {
            size: 512,
            flag: 1 | (1 << 10),
            ret: 0,
            addr: Some(0xa000),
        },
        Call::HalCreate {
            size: 8,
            flag: 0,
            prop: None,
            ret: 0,
            handle: Some(0x77),
        },
        Call::DomainCreate {
            name: "ptaCaching".into(),
            handle: 7,
        },
        Call::RegionsRegister {
            domain: 7,
            regions: vec![RegionDesc {
                device: 0,
                ptr: 0x10,
                size: 1000,
                handle: 0,
            }],
            first: 0,
            total: 1,
        },
        Call::RegionsUnregister {
            domain: 7,
            refs: vec![RegionRef::Pointer(0x10)],
            first: 0,
            total: 1,
        },
        Call::HalRelease {
            handle: 0x77,
            ret: 0,
        },
        Call::HalFree {
            addr: 0xa000,
            ret: 0,
        },
        Call::Mark {
            text: "step".into(),
        },
    ];
    let run = |row_attrs: bool| {
        let mut p = ProcessState::new(100);
        let o = TrackOptions {
            row_attrs,
            ..opts()
        };
        let mut rows = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            p.apply_into(&ev(1, c.clone()), i as u64, &o, None, &mut rows);
        }
        rows
    };
    let (text, numbers) = (run(true), run(false));
    let events: Vec<_> = text.iter().map(|r| r.event).collect();
    assert_eq!(
        events,
        [
            "MALLOC", "FREE", "MALLOC", "MALLOC", "MALLOC", "FREE", "FREE", "FREE", "MSTX"
        ]
    );
    assert_eq!(text.len(), numbers.len());
    for (t, n) in text.iter().zip(&numbers) {
        let attr_size = t
            .attr
            .split(',')
            .find_map(|kv| kv.strip_prefix("size:"))
            .map(|v| v.parse::<u64>().unwrap());
        if matches!(t.event, "MALLOC" | "FREE") {
            assert!(attr_size.is_some(), "{}", t.attr);
            assert_eq!(n.attr, "", "no text without row_attrs");
            assert_eq!(
                Row {
                    attr: t.attr.clone(),
                    ..n.clone()
                },
                *t
            );
        } else {
            assert_eq!(n, t);
        }
        assert_eq!(t.size, attr_size, "{} {}", t.event, t.attr);
    }
    let sizes: Vec<_> = numbers.iter().filter_map(|r| r.size).collect();
    assert_eq!(sizes, [4096, 4096, 512, 8, 1000, 1000, 8, 512]);
}

#[test]
fn a_pools_segments_are_no_leak_and_its_live_regions_are_tensors() {
    let mut p = ProcessState::new(100);
    let o = opts();
    let hal = |size, addr| Call::HalAlloc {
        size,
        flag: (1 << 10) | (33u64 << 56),
        ret: 0,
        addr: Some(addr),
    };
    p.apply(&ev(1, hal(4096, 0x1000)), 1, &o, None);
    p.apply(&ev(1, hal(100, 0x9000)), 2, &o, None);
    p.apply(
        &ev(
            1,
            Call::DomainCreate {
                name: "ptaCaching".into(),
                handle: 7,
            },
        ),
        3,
        &o,
        None,
    );
    let register = |ptr, size| Call::RegionsRegister {
        domain: 7,
        regions: vec![crate::events::decode::RegionDesc {
            device: 0,
            ptr,
            size,
            handle: 0,
        }],
        first: 0,
        total: 1,
    };
    // One region inside the first driver block (the pool's segment), one outside every block.
    p.apply(&ev(1, register(0x1800, 512)), 4, &o, None);
    p.apply(&ev(1, register(0x20000, 64)), 5, &o, None);
    let m = p.exit_memory();
    assert_eq!(
        m.driver_leaks.iter().map(|b| b.addr).collect::<Vec<_>>(),
        [0x9000]
    );
    assert_eq!(
        m.tensor_leaks
            .iter()
            .map(|t| (t.block.addr, t.block.size, t.live_at_end))
            .collect::<Vec<_>>(),
        [(0x1800, 512, true), (0x20000, 64, true)]
    );
    assert_eq!(m.pools.len(), 1);
    let h = &m.pools[0];
    assert_eq!(
        (h.segments, h.segment_bytes, h.live_blocks, h.live_bytes),
        (1, 4096, 2, 576)
    );
    assert!(h.segments_known);
    assert_eq!(h.cached_bytes(), 4096 - 576);
    // The segment freed and its address given to a block no pool uses: a leak, not a segment.
    p.apply(
        &ev(
            1,
            Call::HalFree {
                addr: 0x1000,
                ret: 0,
            },
        ),
        6,
        &o,
        None,
    );
    p.apply(&ev(1, hal(8192, 0x1000)), 7, &o, None);
    let m = p.exit_memory();
    assert_eq!(
        m.driver_leaks.iter().map(|b| b.addr).collect::<Vec<_>>(),
        [0x9000, 0x1000]
    );
    assert_eq!(m.pools[0].segments, 0);
}

#[test]
fn mapped_handles_are_the_segments_of_the_pool_blocks_in_them() {
    const MIB2: u64 = 2 << 20;
    const RANGE: u64 = 0x6000_0000_0000;
    let o = opts();
    let create = |handle| Call::HalCreate {
        size: MIB2,
        flag: 0,
        prop: Some(DrvMemProp {
            side: 1,
            devid: 0,
            module_id: 33,
            pg_type: 1,
            mem_type: 1,
        }),
        ret: 0,
        handle: Some(handle),
    };
    let run = |map: bool| {
        let mut p = ProcessState::new(100);
        p.apply(&ev(1, create(0x77)), 1, &o, None);
        p.apply(&ev(1, create(0x88)), 2, &o, None);
        let reserve = Call::VmmReserve {
            addr: Some(RANGE),
            size: 1 << 30,
            ret: 0,
        };
        p.apply(&ev(1, reserve), 3, &o, None);
        // MindSpore hands the block out first and maps the memory behind it after.
        let alloc = Call::MsPoolAlloc {
            pool: 0x5555,
            size: 512,
            addr: RANGE + 0x200,
            pool_used: None,
            pool_reserved: None,
        };
        let rows = p.apply(&ev(1, alloc), 4, &o, None);
        assert!(
            rows[0].attr.ends_with(",vmm_range:0x0000600000000000"),
            "{}",
            rows[0].attr
        );
        assert_eq!(rows[0].event_type, "MINDSPORE");
        if map {
            let m = Call::VmmMap {
                addr: RANGE,
                size: MIB2,
                handle: 0x77,
                ret: 0,
            };
            p.apply(&ev(1, m), 5, &o, None);
        }
        p
    };
    let p = run(true);
    let m = p.exit_memory();
    // The mapped handle holds the pool's block: cached, not leaked; the other one is a leak.
    assert_eq!(
        m.driver_leaks.iter().map(|b| b.addr).collect::<Vec<_>>(),
        [0x88]
    );
    assert_eq!(m.pools.len(), 1);
    assert_eq!((m.pools[0].segments, m.pools[0].segment_bytes), (1, MIB2));
    assert_eq!(
        m.tensor_leaks
            .iter()
            .map(|t| t.block.addr)
            .collect::<Vec<_>>(),
        [RANGE + 0x200]
    );
    // Without the mapping nothing links the handle to the pool.
    let m = run(false).exit_memory();
    assert_eq!(
        m.driver_leaks.iter().map(|b| b.addr).collect::<Vec<_>>(),
        [0x77, 0x88]
    );
    // Unmapped and released: no segment left behind.
    let mut p = run(true);
    p.apply(
        &ev(
            1,
            Call::VmmUnmap {
                addr: RANGE,
                ret: 0,
            },
        ),
        6,
        &o,
        None,
    );
    p.apply(
        &ev(
            1,
            Call::HalRelease {
                handle: 0x77,
                ret: 0,
            },
        ),
        7,
        &o,
        None,
    );
    let m = p.exit_memory();
    assert_eq!(m.pools[0].segments, 0);
    assert_eq!(
        m.driver_leaks.iter().map(|b| b.addr).collect::<Vec<_>>(),
        [0x88]
    );
    // A block over two mappings (its start in the first): both handles are the pool's,
    // whether mapped before or after the block was handed out.
    for map_first in [false, true] {
        let mut p = ProcessState::new(100);
        p.apply(&ev(1, create(0x77)), 1, &o, None);
        p.apply(&ev(1, create(0x78)), 2, &o, None);
        let reserve = Call::VmmReserve {
            addr: Some(RANGE),
            size: 1 << 30,
            ret: 0,
        };
        p.apply(&ev(1, reserve), 3, &o, None);
        let map = |p: &mut ProcessState, at: u64, handle: u64| {
            let m = Call::VmmMap {
                addr: RANGE + at,
                size: MIB2,
                handle,
                ret: 0,
            };
            p.apply(&ev(1, m), 4, &o, None);
        };
        if map_first {
            map(&mut p, 0, 0x77);
            map(&mut p, MIB2, 0x78);
        }
        let alloc = Call::MsPoolAlloc {
            pool: 0x5555,
            size: 3 << 20,
            addr: RANGE + 0x200,
            pool_used: None,
            pool_reserved: None,
        };
        p.apply(&ev(1, alloc), 5, &o, None);
        if !map_first {
            map(&mut p, 0, 0x77);
            map(&mut p, MIB2, 0x78);
        }
        let m = p.exit_memory();
        assert!(m.driver_leaks.is_empty(), "map first: {map_first}");
        assert_eq!(m.pools[0].segments, 2, "map first: {map_first}");
    }
}

/// PyTorch on CUDA: the runtime's segments are CUDA rows (not HAL), c10's reports the pool's
/// blocks with its own totals, NVTX push/pop the steps; a CPU report is no block.
#[test]
fn cuda_runtime_c10_reports_and_nvtx_steps() {
    use crate::events::cuda::C10Report;
    use crate::trace::probes::ProbeId;
    let mut p = ProcessState::new(100);
    let o = opts();
    let push = Call::RangePush {
        text: "step start".into(),
    };
    p.apply(&ev(1, push), 1, &o, None);
    assert_eq!(p.step, 1);
    let seg = Call::CudaAlloc {
        api: ProbeId::CudaMalloc,
        size: 2 << 20,
        ret: 0,
        addr: Some(0x7000_0000),
    };
    let rows = p.apply(&ev(1, seg), 2, &o, None);
    assert_eq!((rows[0].event, rows[0].event_type), ("MALLOC", "CUDA"));
    assert_eq!(rows[0].device, DeviceKey::Npu(0));
    let report = |size: i64, allocated: u64, r8: u64| {
        Call::C10Usage(C10Report::from_args(&[
            0x7000_0000,
            size as u64,
            allocated,
            2 << 20,
            r8,
        ]))
    };
    let rows = p.apply(&ev(1, report(512, 512, 1)), 3, &o, None);
    assert_eq!((rows[0].event, rows[0].event_type), ("MALLOC", "PTA"));
    assert!(
        rows[0].attr.ends_with("used:512,total:2097152"),
        "{}",
        rows[0].attr
    );
    assert!(
        p.apply(&ev(1, report(64, 64, 0)), 4, &o, None).is_empty(),
        "a CPU block"
    );
    // A pop with nothing pushed on its thread is not a step's end.
    p.apply(&ev(2, Call::RangePop), 5, &o, None);
    assert!(p.step_range.is_some());
    let rows = p.apply(&ev(1, Call::RangePop), 6, &o, None);
    assert_eq!((rows[0].event, rows[0].event_type), ("MSTX", "Range_end"));
    assert_eq!(p.step_range, None);
    let rows = p.apply(&ev(1, report(-512, 0, 1)), 7, &o, None);
    assert_eq!((rows[0].event, rows[0].size), ("FREE", Some(512)));
    let free = Call::CudaFree {
        api: ProbeId::CudaFree,
        addr: 0x7000_0000,
        ret: 0,
    };
    let rows = p.apply(&ev(1, free), 8, &o, None);
    assert_eq!((rows[0].event, rows[0].event_type), ("FREE", "CUDA"));
    // Pinned host memory: device cpu, HOST.
    let host = Call::CudaAlloc {
        api: ProbeId::CudaHostAlloc,
        size: 4096,
        ret: 0,
        addr: Some(0x9000),
    };
    let rows = p.apply(&ev(1, host), 9, &o, None);
    assert_eq!(
        (rows[0].event_type, rows[0].device),
        ("HOST", DeviceKey::Cpu)
    );
}

/// `--pid`: the driver memory mapped before the attach (MindSpore's VMM handles, read at
/// attach) is in the pool rows' `total` from the first one on, counted once.
#[test]
fn driver_memory_mapped_before_the_attach_counts_in_the_pools_total() {
    const MIB2: u64 = 2 << 20;
    let o = opts();
    let mut p = ProcessState::new(100);
    p.driver_before = 3 * MIB2;
    let create = Call::HalCreate {
        size: MIB2,
        flag: 0,
        prop: None,
        ret: 0,
        handle: Some(0x77),
    };
    p.apply(&ev(1, create), 1, &o, None);
    let total_of = |rows: &[Row]| {
        rows.iter()
            .find(|r| r.event_type == "MINDSPORE")
            .and_then(|r| r.attr.split(',').find_map(|a| a.strip_prefix("total:")))
            .map(str::to_string)
    };
    let alloc = |addr| Call::MsPoolAlloc {
        pool: 0x5555,
        size: 512,
        addr,
        pool_used: None,
        pool_reserved: None,
    };
    let rows = p.apply(&ev(1, alloc(0x1000)), 2, &o, None);
    assert_eq!(total_of(&rows).as_deref(), Some("8388608"));
    let rows = p.apply(&ev(1, alloc(0x2000)), 3, &o, None);
    assert_eq!(total_of(&rows).as_deref(), Some("8388608"));
}

/// `--pid` without VMM: the driver memory MindSpore's pool took before the attach is its own
/// reserved bytes (read by the first pool probe) less the driver memory seen, counted once and
/// only when the attach found VMM off (with VMM the counters hold the reserved address range).
#[test]
fn pool_reserved_before_the_attach_counts_in_the_pools_total_without_vmm() {
    const GIB: u64 = 1 << 30;
    let o = opts();
    let total_of = |rows: &[Row]| {
        rows.iter()
            .find(|r| r.event_type == "MINDSPORE")
            .and_then(|r| r.attr.split(',').find_map(|a| a.strip_prefix("total:")))
            .map(str::to_string)
    };
    let alloc = |addr, pool_reserved| Call::MsPoolAlloc {
        pool: 0x5555,
        size: 512,
        addr,
        pool_used: None,
        pool_reserved,
    };
    for (no_vmm, want) in [(true, GIB), (false, 0)] {
        let mut p = ProcessState::new(100);
        p.pool_reserved_unseen = no_vmm;
        let rows = p.apply(&ev(1, alloc(0x1000, Some(GIB))), 2, &o, None);
        assert_eq!(total_of(&rows), Some(want.to_string()), "no_vmm: {no_vmm}");
        // Counted once: a later read (the same 1 GiB) adds nothing.
        let rows = p.apply(&ev(1, alloc(0x2000, Some(GIB))), 3, &o, None);
        assert_eq!(total_of(&rows), Some(want.to_string()), "no_vmm: {no_vmm}");
    }
}
