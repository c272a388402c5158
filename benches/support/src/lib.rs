//! What the benchmark harnesses under `benches/` share, so that every harness computes its
//! quantiles and reads memory the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` (ascending): the element at index
/// `round((len − 1) · p)`; `T::default()` for an empty slice.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `VmRSS` of process `pid` in KiB (`/proc/<pid>/status`); 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A private containerd started by `scripts/containerd-test-env.sh` (root only): its root,
/// state, socket and logs live under [`dir`](Self::dir); stopped and removed on drop.
#[derive(Debug)]
pub struct ContainerdEnv {
    /// The environment's directory.
    pub dir: PathBuf,
    /// containerd's socket (`CONTAINERD_SOCKET`).
    pub socket: PathBuf,
    /// The busybox image reference the script imported (`BUSYBOX_IMAGE`).
    pub busybox: String,
    /// containerd's PID (`CONTAINERD_PID`).
    pub pid: Option<u32>,
    /// containerd's version (`CONTAINERD_VERSION`).
    pub version: String,
}

impl ContainerdEnv {
    /// Runs the script's `subcommand` (`start`, or `start17` for containerd 1.7) on a new
    /// directory `/tmp/<prefix><pid>-<n>`.
    pub fn start(subcommand: &str, prefix: &str) -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = PathBuf::from(format!("/tmp/{prefix}{}-{nanos}", std::process::id()));
        let out = std::process::Command::new("bash")
            .arg(script())
            .arg(subcommand)
            .arg(&dir)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let value = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_default()
                .to_string()
        };
        let env = Self {
            socket: PathBuf::from(value("CONTAINERD_SOCKET")),
            busybox: value("BUSYBOX_IMAGE"),
            pid: value("CONTAINERD_PID").parse().ok(),
            version: value("CONTAINERD_VERSION"),
            dir,
        };
        if !out.status.success() || env.busybox.is_empty() {
            return Err(std::io::Error::other(format!(
                "containerd-test-env.sh {subcommand}: {}{stdout}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(env)
    }

    /// `unix://<socket>`, for CRI clients and `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for ContainerdEnv {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-test-env.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_round_to_the_nearest_index() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
        assert_eq!(ms(Duration::from_micros(1500)), 1.5);
    }

    #[test]
    fn this_process_has_resident_memory_and_a_port_is_found() {
        assert!(rss_kib(std::process::id()) > 0);
        assert_eq!(rss_kib(u32::MAX), 0);
        assert!(free_port().expect("port") > 0);
    }
}

/// One pod of a pod list (the agent's `/pods`, or a LIST of the API server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodState {
    /// `status.phase` is `Running`.
    pub running: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
}

impl PodState {
    /// Running and Ready.
    pub fn running_ready(self) -> bool {
        self.running && self.ready
    }
}

/// Every item of a pod list (JSON `{"items": [...]}`), by name.
pub fn pod_states(
    body: &str,
) -> Result<std::collections::BTreeMap<String, PodState>, serde_json::Error> {
    let list: serde_json::Value = serde_json::from_str(body)?;
    let mut out = std::collections::BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let Some(name) = item["metadata"]["name"].as_str() else {
            continue;
        };
        let status = &item["status"];
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        out.insert(
            name.to_string(),
            PodState {
                running: status["phase"] == "Running",
                ready,
            },
        );
    }
    Ok(out)
}

/// One line of a [`line_chart`]: a name for the legend, a colour, dashed or solid, and its
/// points (x, y).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// SVG colour.
    pub colour: &'static str,
    /// Drawn dashed (baselines) instead of solid.
    pub dashed: bool,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart as an SVG `<g>` element of `width` × `height` at (`left`, `top`): linear axes from
/// 0 to the largest value, ticks at the x values of the first series, four y ticks, a legend in
/// the top left. Written by hand so a benchmark can draw its figures without a plotting library.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    (left, top, width, height): (f64, f64, f64, f64),
) -> String {
    use std::fmt::Write as _;
    let (pad_l, pad_r, pad_t, pad_b) = (60.0, 15.0, 30.0, 45.0);
    let (plot_w, plot_h) = (width - pad_l - pad_r, height - pad_t - pad_b);
    let all = || series.iter().flat_map(|s| s.points.iter());
    let x_max = all()
        .map(|p| p.0)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let y_max = nice_ceiling(all().map(|p| p.1).fold(0.0, f64::max));
    let x = |v: f64| left + pad_l + v / x_max * plot_w;
    let y = |v: f64| top + pad_t + plot_h - v / y_max * plot_h;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<g font-family="sans-serif" font-size="12"><text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
        left + width / 2.0,
        top + 18.0,
        escape(title)
    );
    let _ = write!(
        out,
        r##"<path d="M{:.1},{:.1}V{:.1}H{:.1}" fill="none" stroke="#000"/>"##,
        x(0.0),
        y(y_max),
        y(0.0),
        x(x_max)
    );
    if let Some(first) = series.first() {
        for &(xv, _) in &first.points {
            let _ = write!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><path d="M{:.1},{:.1}v5" stroke="#000"/>"##,
                x(xv),
                y(0.0) + 18.0,
                xv,
                x(xv),
                y(0.0)
            );
        }
    }
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><path d="M{:.1},{:.1}H{:.1}" stroke="#ddd"/>"##,
            x(0.0) - 6.0,
            y(v) + 4.0,
            v,
            x(0.0),
            y(v),
            x(x_max)
        );
    }
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        left + pad_l + plot_w / 2.0,
        top + height - 8.0,
        escape(x_label),
        left + 14.0,
        top + pad_t + plot_h / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(xv, yv)| format!("{:.1},{:.1}", x(xv), y(yv)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            s.colour
        );
        for &(xv, yv) in &s.points {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x(xv),
                y(yv),
                s.colour
            );
        }
        let ly = top + pad_t + 8.0 + 16.0 * i as f64;
        let _ = write!(
            out,
            r#"<path d="M{:.1},{ly:.1}h20" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pad_l + 10.0,
            s.colour,
            left + pad_l + 36.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</g>");
    out
}

/// A whole SVG document of `width` × `height` holding `parts` (from [`line_chart`]).
pub fn svg_document(width: f64, height: f64, parts: &[String]) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}"><rect width="100%" height="100%" fill="#fff"/>{}</svg>
"##,
        parts.concat()
    )
}

/// The smallest of 1, 2, 2.5 or 5 × a power of ten that is at least `v` (at least 1).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let base = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * base)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * base)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod chart_tests {
    use super::*;

    #[test]
    fn axes_round_up_to_a_readable_value() {
        assert_eq!(nice_ceiling(0.3), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(56.0), 100.0);
        assert_eq!(nice_ceiling(21.0), 25.0);
        assert_eq!(nice_ceiling(150.0), 200.0);
    }

    #[test]
    fn a_chart_draws_every_point_and_legend_entry() {
        let s = Series {
            name: "agent <ours>".into(),
            colour: "#c00",
            dashed: false,
            points: vec![(110.0, 1.0), (250.0, 2.0), (500.0, 4.0)],
        };
        let svg = svg_document(
            400.0,
            300.0,
            &[line_chart("t", "pods", "s", &[s], (0.0, 0.0, 400.0, 300.0))],
        );
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("agent &lt;ours&gt;"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
