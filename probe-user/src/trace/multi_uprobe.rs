//! Multi-uprobe links (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6+): one link puts one program on
//! many offsets of one file, optionally only for one process, and is torn down with one
//! grace period instead of one per probe.
//!
//! aya 0.14 has no wrapper, and the kernel only accepts programs loaded with
//! `expected_attach_type = BPF_TRACE_UPROBE_MULTI` for these links, which aya's
//! `UProbe::load` does not set. So the uprobe programs are loaded a second time here: the
//! same object is parsed with aya-obj, its map references are pointed at the maps aya already
//! created (the programs share every map with aya's copies), calls are linked, and the
//! instructions go to `BPF_PROG_LOAD` through the raw syscall.

use std::{
    collections::HashMap,
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use anyhow::{Context, Result, anyhow, bail};
use aya::maps::{Map, MapData};

use crate::trace::bpf::preload::{VERIFIER_LINES, last_lines};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `uprobe_multi.flags`: the program runs at the functions' returns.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to the fields we set; the zeroed tail stands for
/// the fields we leave at their defaults.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    tail: [u32; 19],
}

/// `union bpf_attr` for `BPF_BTF_LOAD`.
#[repr(C)]
struct BtfLoadAttr {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
    tail: [u32; 33],
}

const BPF_BTF_LOAD: libc::c_long = 18;

/// The BTF of one program's code, as `BPF_PROG_LOAD` wants it (bpf_loop callbacks need it).
struct ProgramBtf<'a> {
    fd: &'a OwnedFd,
    func_info: Vec<u8>,
    func_info_rec_size: u32,
    func_info_cnt: u32,
    line_info: Vec<u8>,
    line_info_rec_size: u32,
    line_info_cnt: u32,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` with its `uprobe_multi` member.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    pad: u32,
    tail: [u64; 10],
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i32> {
    // SAFETY: attr is a live, fully initialised bpf_attr image of the given size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as i32)
    }
}

/// The uprobe programs, loaded for multi-uprobe links.
pub struct MultiPrograms {
    fds: HashMap<&'static str, OwnedFd>,
}

fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

/// Copies of the descriptors of every map aya created, by name (take them before
/// `Ebpf::take_map` moves maps out).
pub fn map_fds(ebpf: &aya::Ebpf) -> Result<HashMap<String, OwnedFd>> {
    ebpf.maps()
        .map(|(name, map)| {
            let fd = map_data(map).fd().as_fd().try_clone_to_owned()?;
            Ok((name.to_string(), fd))
        })
        .collect()
}

impl MultiPrograms {
    /// Whether program `name` is loaded here.
    pub fn has(&self, name: &str) -> bool {
        self.fds.contains_key(name)
    }

    /// Loads `names` from `object` with `expected_attach_type = BPF_TRACE_UPROBE_MULTI`,
    /// their maps being the ones in `maps`.
    pub fn load(
        object: &[u8],
        maps: &HashMap<String, OwnedFd>,
        names: &[&'static str],
        kernel_btf: &aya_obj::btf::Btf,
    ) -> Result<Self> {
        let mut obj = aya_obj::Object::parse(object).context("parsing the BPF object")?;
        // The same steps as aya's loader (the kernel here has every BTF feature aya probes).
        let all = aya_obj::btf::BtfFeatures::new(true, true, true, true, true, true, true, true);
        let btf_fd = match obj
            .fixup_and_sanitize_btf(&all)
            .map_err(|e| anyhow!("sanitizing BTF: {e}"))?
        {
            Some(btf) => Some(load_btf(&btf.to_bytes())?),
            None => None,
        };
        obj.relocate_btf(kernel_btf)
            .map_err(|e| anyhow!("CO-RE relocations: {e}"))?;
        let text_sections = obj.functions.keys().map(|(section, _)| *section).collect();
        let obj_maps = std::mem::take(&mut obj.maps);
        let mut missing = Vec::new();
        let refs: Vec<(&str, i32, &aya_obj::Map)> = obj_maps
            .iter()
            .filter_map(|(name, m)| match maps.get(name) {
                Some(fd) => Some((name.as_str(), fd.as_raw_fd(), m)),
                None => {
                    missing.push(name.clone());
                    None
                }
            })
            .collect();
        obj.relocate_maps(refs.into_iter(), &text_sections)
            .map_err(|e| anyhow!("relocating maps: {e} (maps not created: {missing:?})"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| anyhow!("linking calls: {e}"))?;
        let license = obj.license.clone();
        let mut fds = HashMap::new();
        for &name in names {
            let prog = obj
                .programs
                .get(name)
                .ok_or_else(|| anyhow!("program {name} missing from the object"))?;
            let func = obj
                .functions
                .get(&prog.function_key())
                .ok_or_else(|| anyhow!("code of {name} missing from the object"))?;
            let btf = btf_fd.as_ref().map(|fd| ProgramBtf {
                fd,
                func_info: func.func_info.func_info_bytes(),
                func_info_rec_size: func.func_info_rec_size as u32,
                func_info_cnt: func.func_info.len() as u32,
                line_info: func.line_info.line_info_bytes(),
                line_info_rec_size: func.line_info_rec_size as u32,
                line_info_cnt: func.line_info.len() as u32,
            });
            let fd = load_program(name, &func.instructions, &license, btf.as_ref())
                .with_context(|| format!("loading {name} for multi-uprobe links"))?;
            fds.insert(name, fd);
        }
        Ok(MultiPrograms { fds })
    }

    /// One link putting `program` at every `(file offset, cookie)` of `points` in `path`;
    /// `pid` 0 for every process, else only that process (its threads included).
    pub fn attach(
        &self,
        program: &str,
        is_return: bool,
        path: &Path,
        points: &[(u64, u64)],
        pid: u32,
    ) -> std::io::Result<OwnedFd> {
        let prog = self
            .fds
            .get(program)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let offsets: Vec<u64> = points.iter().map(|p| p.0).collect();
        let cookies: Vec<u64> = points.iter().map(|p| p.1).collect();
        let mut attr = LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            target_fd: 0,
            attach_type: BPF_TRACE_UPROBE_MULTI,
            flags: 0,
            path: c_path.as_ptr() as u64,
            offsets: offsets.as_ptr() as u64,
            ref_ctr_offsets: 0,
            cookies: cookies.as_ptr() as u64,
            cnt: points.len() as u32,
            multi_flags: if is_return {
                BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            pid,
            pad: 0,
            tail: [0; 10],
        };
        let fd = sys_bpf(BPF_LINK_CREATE, &mut attr)?;
        // SAFETY: the kernel just returned this descriptor to us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn load_btf(bytes: &[u8]) -> Result<OwnedFd> {
    let mut log = vec![0u8; 1 << 16];
    let mut attr = BtfLoadAttr {
        btf: bytes.as_ptr() as u64,
        btf_log_buf: log.as_mut_ptr() as u64,
        btf_size: bytes.len() as u32,
        btf_log_size: log.len() as u32,
        btf_log_level: 1,
        tail: [0; 33],
    };
    match sys_bpf(BPF_BTF_LOAD, &mut attr) {
        // SAFETY: the kernel just returned this descriptor to us.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => bail!(
            "loading the programs' BTF: {e}\n{}",
            String::from_utf8_lossy(&log).trim_end_matches('\0')
        ),
    }
}

fn load_program(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    license: &CString,
    btf: Option<&ProgramBtf>,
) -> Result<OwnedFd> {
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut log = vec![0u8; 0];
    for attempt in 0..2 {
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_KPROBE,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: if attempt == 0 { 0 } else { 1 },
            log_size: log.len() as u32,
            log_buf: if attempt == 0 {
                0
            } else {
                log.as_mut_ptr() as u64
            },
            kern_version: 0,
            prog_flags: 0,
            prog_name,
            prog_ifindex: 0,
            expected_attach_type: BPF_TRACE_UPROBE_MULTI,
            prog_btf_fd: btf.map_or(0, |b| b.fd.as_raw_fd() as u32),
            func_info_rec_size: btf.map_or(0, |b| b.func_info_rec_size),
            func_info: btf.map_or(0, |b| b.func_info.as_ptr() as u64),
            func_info_cnt: btf.map_or(0, |b| b.func_info_cnt),
            line_info_rec_size: btf.map_or(0, |b| b.line_info_rec_size),
            line_info: btf.map_or(0, |b| b.line_info.as_ptr() as u64),
            line_info_cnt: btf.map_or(0, |b| b.line_info_cnt),
            tail: [0; 19],
        };
        match sys_bpf(BPF_PROG_LOAD, &mut attr) {
            // SAFETY: the kernel just returned this descriptor to us.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) if attempt == 0 => {
                // Again with the verifier's log, for the error message.
                log = vec![0u8; 1 << 22];
                let _ = e;
            }
            Err(e) => {
                let tail = last_lines(&String::from_utf8_lossy(&log), VERIFIER_LINES);
                bail!("{e}\n{tail}");
            }
        }
    }
    unreachable!()
}
