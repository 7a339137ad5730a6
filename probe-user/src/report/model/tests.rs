use super::*;

const H: &str = crate::output::csv::CSV_HEADER;

fn model_of(name: &str, text: &str) -> Model {
    let dir = std::env::temp_dir().join(format!("memscope-model-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("memscope_dump_1.csv");
    std::fs::write(&p, text).unwrap();
    let m = load(&dir, 100).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    m
}

#[test]
fn replays_like_analyze_with_pools_apart() {
    // 4096 freed by id; 100 freed by a FREE whose id matches nothing (stays live); a PTA
    // region is a pool line, not driver memory (device 1: its track's snapshots are its
    // tensors); pinned host memory is driver memory on cpu.
    let m = model_of(
        "ours",
        &format!(
            "{H}\n\
             0,MSTX,Range_start,\"step start\",1,7,7,0,N/A,,,\n\
             1,MALLOC,HAL,N/A,10,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:4096}}\",,\n\
             2,MALLOC,HAL,N/A,15,7,8,0,0x0000000000009000,\"{{allocation_id:2,addr:0x0000000000009000,size:100,used:4196}}\",,\n\
             3,FREE,HAL,N/A,20,7,8,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:4096,used:100}}\",,\n\
             4,FREE,HAL,N/A,40,7,8,0,0x0000000000009000,\"{{allocation_id:9,addr:0x0000000000009000,size:100,used:100}}\",,\n\
             5,MALLOC,PTA,N/A,41,7,8,1,0x0000000000003000,\"{{allocation_id:4,addr:0x0000000000003000,size:50000,used:1,total:1}}\",,\n\
             6,MALLOC,HOST,N/A,42,7,8,cpu,0x0000000000004000,\"{{allocation_id:5,addr:0x0000000000004000,size:64,pinned:true,used:64}}\",,\n"
        ),
    );
    let d0 = &m.tracks[&TrackKey {
        pid: 7,
        device: DeviceKey::Npu(0),
    }];
    assert_eq!((d0.peak, d0.peak_ts), (4196, 15));
    assert_eq!(d0.pool_peak, 0);
    let d1 = TrackKey {
        pid: 7,
        device: DeviceKey::Npu(1),
    };
    assert_eq!(m.tracks[&d1].pool_peak, 50000);
    assert_eq!((d0.mallocs, d0.frees, d0.unmatched_frees), (2, 1, 1));
    assert_eq!(d0.end_bytes, 100);
    let cpu = &m.tracks[&TrackKey {
        pid: 7,
        device: DeviceKey::Cpu,
    }];
    assert_eq!(cpu.peak, 64);
    let leaks: Vec<(u64, u32)> = m
        .leaks
        .values()
        .flatten()
        .map(|b| (b.size, b.step))
        .collect();
    assert_eq!(leaks, [(100, 1), (64, 1)]);
    // The curve's largest point is the peak, with the pool beside it.
    assert_eq!(d0.points.iter().map(|p| p.driver).max(), Some(4196));
    // What was live at the peak, and at t=12 (only the 4096 block).
    let s = m.snapshots(&[
        Moment::AfterEvent(d0.peak_event.unwrap()),
        Moment::AtTime(12),
        Moment::End,
    ]);
    let key = TrackKey {
        pid: 7,
        device: DeviceKey::Npu(0),
    };
    assert_eq!(s[0][&key].iter().map(|b| b.size).sum::<u64>(), 4196);
    assert_eq!(
        s[1][&key].iter().map(|b| b.size).collect::<Vec<_>>(),
        [4096]
    );
    // A track with a pool is drawn by its tensors.
    assert_eq!(
        s[2][&d1].iter().map(|b| b.size).collect::<Vec<_>>(),
        [50000]
    );
}

#[test]
fn reads_msmemscope_old_layout_out_of_order() {
    // Rows written at free time (not in time order), negative FREE sizes, decimal Ptr,
    // owner from MID.
    let m = model_of(
        "old",
        &format!(
            "{H}\n\
             4,MALLOC,HAL,N/A,40,5,5,0,4096,\"{{addr:4096,size:10,owner:,MID:7}}\",,\n\
             5,FREE,HAL,N/A,50,5,5,0,4096,\"{{addr:4096,size:-10,owner:,MID:7}}\",,\n\
             2,MALLOC,HAL,N/A,20,5,5,0,4096,\"{{addr:4096,size:30,owner:,MID:33}}\",,\n\
             3,FREE,HAL,N/A,30,5,5,0,4096,\"{{addr:4096,size:-30,owner:,MID:33}}\",,\n\
             6,MALLOC,HAL,N/A,60,5,5,0,8192,\"{{addr:8192,size:20,owner:,MID:33}}\",,\n"
        ),
    );
    let t = &m.tracks[&TrackKey {
        pid: 5,
        device: DeviceKey::Npu(0),
    }];
    assert_eq!(t.peak, 30);
    assert_eq!(t.end_bytes, 20);
    let owners: Vec<&str> = t.owners.iter().map(|o| m.name(*o)).collect();
    assert_eq!(owners, ["CANN@33", "CANN@7"]);
    assert_eq!(m.leaks.values().flatten().count(), 1);
    // 100 ms intervals: everything is in the first.
    assert_eq!(t.timeline.len(), 1);
    assert_eq!(t.timeline[0].bytes, 30);
}
