//! The driver's memory vocabulary: the `halMemAlloc` flag word, `drv_mem_prop`, module names.

/// Device id written as `cpu` (host memory).
pub const DEVICE_CPU: u32 = 10000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemType {
    Svm,
    Device,
    Host,
    Dvpp,
    Invalid(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageType {
    Normal,
    Huge,
    Giant,
}

impl PageType {
    pub fn as_str(self) -> &'static str {
        match self {
            PageType::Normal => "normal",
            PageType::Huge => "huge",
            PageType::Giant => "giant",
        }
    }

    /// `drv_mem_prop.pg_type`: 0 normal, 1 huge, 2 giant.
    pub fn from_prop(pg_type: u32) -> Self {
        match pg_type {
            1 => PageType::Huge,
            2 => PageType::Giant,
            _ => PageType::Normal,
        }
    }
}

/// The `flag` argument of `halMemAlloc`, decoded (bit layout of spec §1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocFlag {
    pub device: u32,
    pub mem_type: MemType,
    pub page_type: PageType,
    pub module_id: u8,
}

impl AllocFlag {
    pub fn decode(flag: u64) -> Self {
        let device = (flag & 0x3FF) as u32;
        let mem_type = match ((flag & 0x3C00) >> 10) as u8 {
            0 => MemType::Svm,
            1 => MemType::Device,
            2 => MemType::Host,
            3 => MemType::Dvpp,
            other => MemType::Invalid(other),
        };
        // Giant is checked first: a flag with both bits asks for 1G pages.
        let page_type = if flag & (1 << 31) != 0 {
            PageType::Giant
        } else if flag & (1 << 17) != 0 {
            PageType::Huge
        } else {
            PageType::Normal
        };
        let module_id = (flag >> 56) as u8;
        AllocFlag {
            device,
            mem_type,
            page_type,
            module_id,
        }
    }

    /// Host memory is reported on device `cpu`.
    pub fn reported_device(&self) -> u32 {
        if self.mem_type == MemType::Host {
            DEVICE_CPU
        } else {
            self.device
        }
    }
}

/// `struct drv_mem_prop { u32 side, devid, module_id, pg_type, mem_type; u64 reserve; }`
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrvMemProp {
    pub side: u32,
    pub devid: u32,
    pub module_id: u32,
    pub pg_type: u32,
    pub mem_type: u32,
}

impl DrvMemProp {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(
                b.get(i * 4..i * 4 + 4)?.try_into().ok()?,
            ))
        };
        Some(DrvMemProp {
            side: word(0)?,
            devid: word(1)?,
            module_id: word(2)?,
            pg_type: word(3)?,
            mem_type: word(4)?,
        })
    }
}

/// The driver's module-id table (ids 0..=75), as the driver's log module enum defines it.
const MODULE_NAMES: [&str; 76] = [
    "SLOG",
    "IDEDD",
    "IDEDH",
    "HCCL",
    "FMK",
    "HIAIENGINE",
    "DVPP",
    "RUNTIME",
    "CCE",
    "HDC",
    "DRV",
    "MDCFUSION",
    "MDCLOCATION",
    "MDCPERCEPTION",
    "MDCFSM",
    "MDCCOMMON",
    "MDCMONITOR",
    "MDCBSWP",
    "MDCDEFAULT",
    "MDCSC",
    "MDCPNC",
    "MLL",
    "DEVMM",
    "KERNEL",
    "LIBMEDIA",
    "CCECPU",
    "ASCENDDK",
    "ROS",
    "HCCP",
    "ROCE",
    "TEFUSION",
    "PROFILING",
    "DP",
    "APP",
    "TS",
    "TSDUMP",
    "AICPU",
    "LP",
    "TDT",
    "FE",
    "MD",
    "MB",
    "ME",
    "IMU",
    "IMP",
    "GE",
    "MDCFUSA",
    "CAMERA",
    "ASCENDCL",
    "TEEOS",
    "ISP",
    "SIS",
    "HSM",
    "DSS",
    "PROCMGR",
    "BBOX",
    "AIVECTOR",
    "TBE",
    "FV",
    "MDCMAP",
    "TUNE",
    "HSS",
    "FFTS",
    "OP",
    "UDF",
    "HICAID",
    "TSYNC",
    "AUDIO",
    "TPRT",
    "ASCENDCKERNEL",
    "ASYS",
    "ATRACE",
    "RTC",
    "SYSMONITOR",
    "AML",
    "INVLID_MOUDLE_ID",
];

/// The module name for an id, `None` for ids outside the table.
pub fn module_name(id: u32) -> Option<&'static str> {
    MODULE_NAMES.get(id as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_flag_field() {
        let f = AllocFlag::decode(5 | (1 << 10) | (1 << 17) | (33u64 << 56));
        assert_eq!(f.device, 5);
        assert_eq!(f.mem_type, MemType::Device);
        assert_eq!(f.page_type, PageType::Huge);
        assert_eq!(f.module_id, 33);
        assert_eq!(f.reported_device(), 5);

        let host = AllocFlag::decode(3 | (2 << 10));
        assert_eq!(host.mem_type, MemType::Host);
        assert_eq!(host.reported_device(), DEVICE_CPU);

        let giant = AllocFlag::decode((1 << 31) | (1 << 17));
        assert_eq!(giant.page_type, PageType::Giant);
        assert_eq!(AllocFlag::decode(0x3FF).device, 1023);
        assert_eq!(AllocFlag::decode(9 << 10).mem_type, MemType::Invalid(9));
        assert_eq!(AllocFlag::decode(3 << 10).mem_type, MemType::Dvpp);
        assert_eq!(AllocFlag::decode(0).mem_type, MemType::Svm);
    }

    #[test]
    fn module_table_matches_known_ids() {
        for (id, name) in [
            (3, "HCCL"),
            (4, "FMK"),
            (7, "RUNTIME"),
            (33, "APP"),
            (45, "GE"),
            (48, "ASCENDCL"),
            (63, "OP"),
            (75, "INVLID_MOUDLE_ID"),
        ] {
            assert_eq!(module_name(id), Some(name), "module {id}");
        }
        assert_eq!(module_name(76), None);
    }

    #[test]
    fn reads_prop_struct() {
        let mut b = [0u8; 32];
        for (i, v) in [0u32, 2, 7, 1, 0].iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let p = DrvMemProp::from_bytes(&b).unwrap();
        assert_eq!((p.devid, p.module_id, p.pg_type), (2, 7, 1));
        assert_eq!(PageType::from_prop(p.pg_type), PageType::Huge);
        assert!(DrvMemProp::from_bytes(&b[..10]).is_none());
    }
}
