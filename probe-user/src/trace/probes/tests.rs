use super::*;

#[test]
fn ids_are_unique_and_round_trip() {
    for p in &PROBES {
        assert_eq!(ProbeId::from_raw(p.id as u16), Some(p.id));
        assert!((p.id as u32) < probe_common::MAX_PROBES);
    }
    // One id per probe, but for the task classes' `Run()`: one id, one spec.
    let mut ids: Vec<_> = PROBES.iter().map(|p| p.id).collect();
    ids.dedup();
    assert_eq!(ids.len(), PROBES.len() - (MS_TASK_RUNS.len() - 1));
    for p in PROBES.iter().filter(|p| p.id == ProbeId::MsTaskRun) {
        assert_eq!(p.spec, ms_task_run(0).spec);
    }
    let mut sorted: Vec<_> = PROBES.iter().map(|p| p.id).collect();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        ids.len(),
        "a shared id is one run of neighbours"
    );
    assert_eq!(ProbeId::from_raw(0), None);
}

#[test]
fn library_name_matching() {
    assert!(library_matches("libascend_hal.so", HAL_LIBRARY));
    assert!(library_matches("libascend_hal.so.1", HAL_LIBRARY));
    assert!(!library_matches("libascend_hal.so_backup", HAL_LIBRARY));
    assert!(!library_matches("libascend_hal_stub.so", HAL_LIBRARY));
    let hal: Vec<_> = expected_in("libascend_hal.so")
        .iter()
        .map(|p| p.symbol)
        .collect();
    assert_eq!(
        hal,
        ["halMemAlloc", "halMemFree", "halMemCreate", "halMemRelease"]
    );
    assert_eq!(expected_in("libms_tools_ext.so").len(), 8);
    for p in &PROBES {
        if p.spec.flags & sf::BATCH != 0 {
            let quarter = probe_common::DATA_LEN as u32 / 4;
            assert!(p.spec.per_chunk * p.spec.elem_size < probe_common::DATA_LEN as u32);
            if p.spec.array2_off != NO_ARRAY2 {
                assert!(p.spec.array2_base >= p.spec.per_chunk * p.spec.elem_size);
                assert_eq!(p.spec.array2_base % quarter, 0);
                assert!(p.spec.per_chunk * p.spec.elem2_size < quarter);
            }
        }
        if p.spec.flags & sf::INDIRECT != 0 {
            let half = probe_common::DATA_LEN as u32 / 2;
            assert!(p.spec.data_len < half && p.spec.indirect_len < half);
        }
    }
}
