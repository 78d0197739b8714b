//! The machine a benchmark ran on, named in its output: the same build's figures differ a lot
//! between CPUs (AMD's and Intel's vector units, the instructions the kernels may use), so a
//! figure without its CPU cannot be compared with anything.

/// The CPU flags that decide which kernels run: hacpo's and `gemm`'s (AVX2/FMA, AVX-512),
/// bf16 products (AVX512-BF16, AMX), and Arm's vector units.
const FLAGS: [&str; 11] =
    ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "asimd", "sve", "bf16", "i8mm"];

/// What a benchmark names: the CPU's model, its family and model numbers where the CPU gives
/// them (x86: they tell an AMD Zen 4 from a Zen 5 behind one model name), the cores the process
/// may use and the [`FLAGS`] the CPU has.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Machine {
    pub cpu: String,
    pub family: Option<u32>,
    pub model: Option<u32>,
    pub cores: usize,
    pub flags: Vec<&'static str>,
}

impl Machine {
    /// This machine, from `/proc/cpuinfo` (Linux); elsewhere the architecture alone.
    pub fn here() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match std::fs::read_to_string("/proc/cpuinfo") {
            Ok(text) => Self::of_cpuinfo(&text, cores),
            Err(_) => Self { cpu: std::env::consts::ARCH.to_string(), family: None, model: None, cores, flags: vec![] },
        }
    }

    /// The first processor's entry of a `/proc/cpuinfo` text (x86's `model name`, `cpu family`,
    /// `model`, `flags`; Arm's `Features`, and its `CPU part` where no model name is given).
    pub fn of_cpuinfo(text: &str, cores: usize) -> Self {
        let field = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let number = |key: &str| field(key).and_then(|v| v.parse().ok());
        let cpu = field("model name")
            .or_else(|| field("CPU part").map(|p| format!("{} (CPU part {p})", std::env::consts::ARCH)))
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let has = field("flags").or_else(|| field("Features")).unwrap_or_default();
        let has: Vec<&str> = has.split_whitespace().collect();
        let flags = FLAGS.iter().copied().filter(|f| has.contains(f)).collect();
        Self { cpu, family: number("cpu family"), model: number("model"), cores, flags }
    }

    /// One line: `AMD EPYC (family 25, model 17), 2 cores, avx2 fma avx512f avx512_bf16`.
    pub fn describe(&self) -> String {
        let numbers = match (self.family, self.model) {
            (Some(f), Some(m)) => format!(" (family {f}, model {m})"),
            _ => String::new(),
        };
        let flags = match self.flags.is_empty() {
            true => "none of the vector flags hacpo picks kernels by".to_string(),
            false => self.flags.join(" "),
        };
        format!("{}{numbers}, {} cores, {flags}", self.cpu, self.cores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_an_x86_cpu_by_model_numbers_and_the_flags_that_pick_kernels() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
                    model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16\n\n\
                    processor\t: 1\nmodel name\t: other\n";
        let m = Machine::of_cpuinfo(text, 2);
        assert_eq!(m.cpu, "AMD EPYC");
        assert_eq!((m.family, m.model), (Some(25), Some(17)));
        assert_eq!(m.flags, ["avx2", "fma", "avx512f", "avx512_bf16"]);
        assert_eq!(m.describe(), "AMD EPYC (family 25, model 17), 2 cores, avx2 fma avx512f avx512_bf16");
    }

    #[test]
    fn names_an_arm_cpu_by_its_part_and_says_when_no_flag_is_known() {
        let arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU part\t: 0xd40\n";
        let m = Machine::of_cpuinfo(arm, 4);
        assert!(m.cpu.ends_with("(CPU part 0xd40)"), "{}", m.cpu);
        assert_eq!(m.flags, ["asimd", "sve", "bf16", "i8mm"]);
        let bare = Machine::of_cpuinfo("", 1);
        assert_eq!(bare.cpu, std::env::consts::ARCH);
        assert!(bare.describe().ends_with("1 cores, none of the vector flags hacpo picks kernels by"));
    }
}
