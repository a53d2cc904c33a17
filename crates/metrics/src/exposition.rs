//! The text exposition: Prometheus 0.0.4 (what Pulsar serves) or OpenMetrics 1.0.0 (when the
//! scraper asks for it). Samples may arrive in any order; each family's samples are kept
//! together under its `# HELP` and `# TYPE` lines, families in order of first appearance.

use std::collections::HashMap;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The format a scraper's `Accept` header asks for (OpenMetrics only when named).
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A family's type. Counter families are named without `_total` (their samples add it),
/// histograms and summaries without `_bucket`/`_count`/`_sum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// No type (OpenMetrics: `unknown`); read like a gauge.
    Untyped,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
            Kind::Untyped => "untyped",
        }
    }
}

struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    samples: String,
}

/// An exposition being built.
pub struct Exposition {
    format: Format,
    families: Vec<Family>,
    index: HashMap<&'static str, usize>,
    /// The family written last: samples come in runs (each topic writes the same families in
    /// the same order), so the next one is usually this or the one after it, found without
    /// hashing (a scrape of 10,000 topics writes ~400,000 samples).
    last: usize,
    /// Bytes each new family's buffer starts with (see [`Exposition::with_family_capacity`]).
    family_capacity: usize,
}

/// A label set: `(name, value)` pairs; values are escaped when written.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    pub fn new(format: Format) -> Self {
        Self::with_family_capacity(format, 0)
    }

    /// An exposition whose families start with `bytes` of buffer each: with one sample per
    /// topic and 10,000 topics, growing the buffers by doubling copied more than the scrape
    /// wrote (untouched capacity costs address space, not memory).
    pub fn with_family_capacity(format: Format, bytes: usize) -> Self {
        Exposition {
            format,
            families: Vec::new(),
            index: HashMap::new(),
            last: 0,
            family_capacity: bytes,
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> &mut Family {
        let near = [self.last, self.last + 1];
        let at = match near
            .into_iter()
            .find(|&i| self.families.get(i).is_some_and(|f| f.name == name))
        {
            Some(at) => at,
            None => {
                let families = &mut self.families;
                let capacity = self.family_capacity;
                *self.index.entry(name).or_insert_with(|| {
                    let samples = String::with_capacity(capacity);
                    families.push(Family { name, kind, help, samples });
                    families.len() - 1
                })
            }
        };
        self.last = at;
        let family = &mut self.families[at];
        assert_eq!(family.kind, kind, "family {name} declared with two types");
        family
    }

    /// Declares a family even if no sample follows (dashboards then find its HELP/TYPE).
    pub fn declare(&mut self, name: &'static str, kind: Kind, help: &'static str) {
        self.family(name, kind, help);
    }

    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        value: f64,
    ) {
        let family = self.family(name, Kind::Gauge, help);
        write_sample(&mut family.samples, name, "", labels, None, value);
    }

    /// A sample of a family without a type.
    pub fn untyped(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        value: f64,
    ) {
        let family = self.family(name, Kind::Untyped, help);
        write_sample(&mut family.samples, name, "", labels, None, value);
    }

    /// A counter sample; `name` is the family's, the sample is `name_total`.
    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        value: u64,
    ) {
        let family = self.family(name, Kind::Counter, help);
        write_sample(&mut family.samples, name, "_total", labels, None, value as f64);
    }

    /// A counter with a fractional value (seconds of CPU time, say).
    pub fn counter_f64(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        value: f64,
    ) {
        let family = self.family(name, Kind::Counter, help);
        write_sample(&mut family.samples, name, "_total", labels, None, value);
    }

    /// A summary without quantiles: `name_count` and `name_sum` (how Pulsar's `_count` and
    /// `_sum` series are typed correctly).
    pub fn summary(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        count: u64,
        sum: f64,
    ) {
        let family = self.family(name, Kind::Summary, help);
        write_sample(&mut family.samples, name, "_count", labels, None, count as f64);
        write_sample(&mut family.samples, name, "_sum", labels, None, sum);
    }

    /// A summary with quantiles (BookKeeper's latency series): one `quantile` sample per
    /// `(quantile, value)`, then the cumulative `name_count` and `name_sum`.
    pub fn summary_quantiles(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        quantiles: &[(&str, f64)],
        count: u64,
        sum: f64,
    ) {
        let family = self.family(name, Kind::Summary, help);
        for (quantile, value) in quantiles {
            let extra = Some(("quantile", *quantile));
            write_sample(&mut family.samples, name, "", labels, extra, *value);
        }
        write_sample(&mut family.samples, name, "_count", labels, None, count as f64);
        write_sample(&mut family.samples, name, "_sum", labels, None, sum);
    }

    /// A histogram from cumulative counts per bound (the last entry is the total count);
    /// bounds and sum are divided by `divisor` (microseconds to seconds: 1e6; dividing keeps
    /// `le="0.00005"` exact where multiplying by 1e-6 would not).
    #[allow(clippy::too_many_arguments)]
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &(impl SampleLabels + ?Sized),
        bounds: &[u64],
        cumulative: &[u64],
        sum: u64,
        divisor: f64,
    ) {
        assert_eq!(cumulative.len(), bounds.len() + 1, "one count per bound and +Inf");
        let family = self.family(name, Kind::Histogram, help);
        for (bound, count) in bounds.iter().zip(cumulative) {
            let le = format_value(*bound as f64 / divisor);
            let le = Some(("le", le.as_str()));
            write_sample(&mut family.samples, name, "_bucket", labels, le, *count as f64);
        }
        let total = cumulative[bounds.len()] as f64;
        let inf = Some(("le", "+Inf"));
        write_sample(&mut family.samples, name, "_bucket", labels, inf, total);
        write_sample(&mut family.samples, name, "_count", labels, None, total);
        write_sample(&mut family.samples, name, "_sum", labels, None, sum as f64 / divisor);
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        self.finish_parts().concat()
    }

    /// The exposition text in parts, to be sent one after the other: each family's header,
    /// then its samples' buffer as it is (a scrape of 10,000 topics is ~50 MiB; joining it
    /// into one string was a sixth of the scrape's time, copying and faulting in pages).
    pub fn finish_parts(self) -> Vec<String> {
        let mut parts = Vec::with_capacity(self.families.len() * 2 + 1);
        for family in self.families {
            let header = match (self.format, family.kind) {
                (Format::Prometheus, Kind::Counter) => format!("{}_total", family.name),
                _ => family.name.to_string(),
            };
            let kind = match (self.format, family.kind) {
                (Format::OpenMetrics, Kind::Untyped) => "unknown",
                (_, kind) => kind.name(),
            };
            let mut head = String::with_capacity(2 * header.len() + family.help.len() + 24);
            let _ = writeln!(head, "# HELP {header} {}", family.help);
            let _ = writeln!(head, "# TYPE {header} {kind}");
            parts.push(head);
            if !family.samples.is_empty() {
                parts.push(family.samples);
            }
        }
        if self.format == Format::OpenMetrics {
            parts.push("# EOF\n".to_string());
        }
        parts
    }
}

fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &(impl SampleLabels + ?Sized),
    extra: Option<(&str, &str)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    let open = out.len();
    out.push('{');
    let any = labels.write_to(out);
    match extra {
        Some((label, value)) => {
            if any {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            out.push_str(value);
            out.push_str("\"}");
        }
        None if any => out.push('}'),
        None => out.truncate(open),
    }
    out.push(' ');
    push_value(out, value);
    out.push('\n');
}

/// A sample's labels: pairs (escaped at every sample) or a [`LabelSet`] (rendered once).
pub trait SampleLabels {
    /// Writes `name="value",...` (no braces); returns whether anything was written.
    fn write_to(&self, out: &mut String) -> bool;
}

impl SampleLabels for [(&str, &str)] {
    fn write_to(&self, out: &mut String) -> bool {
        for (i, (label, value)) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape_into(out, value);
            out.push('"');
        }
        !self.is_empty()
    }
}

impl<const N: usize> SampleLabels for [(&str, &str); N] {
    fn write_to(&self, out: &mut String) -> bool {
        self.as_slice().write_to(out)
    }
}

impl SampleLabels for Vec<(&str, &str)> {
    fn write_to(&self, out: &mut String) -> bool {
        self.as_slice().write_to(out)
    }
}

/// Labels rendered once (escaped, `name="value",...`) for the many samples that share them:
/// a topic's ~60 series copy one string instead of escaping every value again (a scrape of
/// 10,000 topics writes ~400,000 samples).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSet {
    rendered: String,
}

impl LabelSet {
    pub fn new(labels: &[(&str, &str)]) -> LabelSet {
        let mut rendered = String::with_capacity(128);
        labels.write_to(&mut rendered);
        LabelSet { rendered }
    }

    /// These labels and one more.
    pub fn with(&self, label: &str, value: &str) -> LabelSet {
        let mut rendered =
            String::with_capacity(self.rendered.len() + label.len() + value.len() + 4);
        rendered.push_str(&self.rendered);
        if !rendered.is_empty() {
            rendered.push(',');
        }
        [(label, value)].write_to(&mut rendered);
        LabelSet { rendered }
    }
}

impl SampleLabels for LabelSet {
    fn write_to(&self, out: &mut String) -> bool {
        out.push_str(&self.rendered);
        !self.rendered.is_empty()
    }
}

fn escape_into(out: &mut String, value: &str) {
    if !value.contains(['\\', '"', '\n']) {
        out.push_str(value); // the usual case, in one copy
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes `value` as Prometheus reads it (integers without a fraction), without allocating.
fn push_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        push_integer(out, value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Most samples are integers (counters, counts, bytes): written digit by digit rather than
/// through the formatting machinery.
fn push_integer(out: &mut String, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        out.push('-');
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

fn format_value(value: f64) -> String {
    let mut out = String::new();
    push_value(&mut out, value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_set_writes_what_its_pairs_write() {
        let pairs = [("cluster", "c"), ("topic", "a \"quoted\\ \n name")];
        let set = LabelSet::new(&pairs);
        let (mut by_pairs, mut by_set) =
            (Exposition::new(Format::Prometheus), Exposition::new(Format::Prometheus));
        by_pairs.gauge("g", "G.", &pairs, 1.0);
        by_set.gauge("g", "G.", &set, 1.0);
        by_pairs.histogram("h", "H.", &pairs, &[1, 2], &[1, 2, 3], 4, 1.0);
        by_set.histogram("h", "H.", &set, &[1, 2], &[1, 2, 3], 4, 1.0);
        let extended = [("cluster", "c"), ("topic", "a \"quoted\\ \n name"), ("subscription", "s")];
        by_pairs.counter("n", "N.", &extended, 5);
        by_set.counter("n", "N.", &set.with("subscription", "s"), 5);
        by_pairs.histogram("e", "E.", &[] as &[(&str, &str)], &[1], &[0, 0], 0, 1.0);
        by_set.histogram("e", "E.", &LabelSet::default(), &[1], &[0, 0], 0, 1.0);
        let text = by_set.finish();
        assert_eq!(by_pairs.finish(), text);
        assert!(text.contains(r#"g{cluster="c",topic="a \"quoted\\ \n name"} 1"#), "{text}");
        assert!(
            text.contains("e_bucket{le=\"1\"} 0\ne_bucket{le=\"+Inf\"} 0\ne_count 0\n"),
            "{text}"
        );
    }

    #[test]
    fn families_stay_together_whatever_the_sample_order() {
        let mut e = Exposition::new(Format::Prometheus);
        e.gauge("a", "A.", &[("topic", "t1")], 1.0);
        e.counter("b", "B.", &[("topic", "t1")], 2);
        e.gauge("a", "A.", &[("topic", "t2")], 0.5);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP a A.\n# TYPE a gauge\na{topic=\"t1\"} 1\na{topic=\"t2\"} 0.5\n\
             # HELP b_total B.\n# TYPE b_total counter\nb_total{topic=\"t1\"} 2\n"
        );
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let mut e = Exposition::new(Format::OpenMetrics);
        e.counter("requests", "Requests.", &[], 3);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP requests Requests.\n# TYPE requests counter\nrequests_total 3\n# EOF\n"
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=1.0.0")),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(Format::negotiate(None), Format::Prometheus);
    }

    #[test]
    fn summary_quantiles_follow_the_labels_then_count_and_sum() {
        let mut e = Exposition::new(Format::Prometheus);
        let quantiles = [("0.5", 0.25), ("1.0", 2.0)];
        e.summary_quantiles("lat", "L.", &[("success", "true")], &quantiles, 7, 3.5);
        e.summary_quantiles("bare", "B.", &[] as &[(&str, &str)], &[("0.5", 1.0)], 1, 1.0);
        assert_eq!(
            e.finish(),
            "# HELP lat L.\n# TYPE lat summary\n\
             lat{success=\"true\",quantile=\"0.5\"} 0.25\n\
             lat{success=\"true\",quantile=\"1.0\"} 2\n\
             lat_count{success=\"true\"} 7\nlat_sum{success=\"true\"} 3.5\n\
             # HELP bare B.\n# TYPE bare summary\nbare{quantile=\"0.5\"} 1\nbare_count 1\nbare_sum 1\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_and_scaled() {
        let mut e = Exposition::new(Format::Prometheus);
        e.histogram("lat_seconds", "L.", &[("x", "y")], &[50, 1000], &[1, 3, 4], 2500, 1e6);
        let text = e.finish();
        assert!(text.contains("lat_seconds_bucket{x=\"y\",le=\"0.00005\"} 1\n"), "{text}");
        assert!(text.contains("lat_seconds_bucket{x=\"y\",le=\"0.001\"} 3\n"), "{text}");
        assert!(text.contains("lat_seconds_bucket{x=\"y\",le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("lat_seconds_count{x=\"y\"} 4\n"), "{text}");
        assert!(text.contains("lat_seconds_sum{x=\"y\"} 0.0025\n"), "{text}");
    }

    #[test]
    fn integers_are_written_as_the_formatter_writes_them() {
        for value in [0i64, 7, -7, 10, 99, 100, 1_234_567, -987_654_321, 999_999_999_999_999] {
            let mut out = String::new();
            push_value(&mut out, value as f64);
            assert_eq!(out, value.to_string());
        }
        let mut out = String::new();
        push_value(&mut out, 1e15);
        push_value(&mut out, 0.25);
        assert_eq!(out, "10000000000000000.25");
    }

    #[test]
    fn label_values_are_escaped_and_special_values_spelled_as_prometheus_reads_them() {
        let mut e = Exposition::new(Format::Prometheus);
        e.gauge("g", "G.", &[("l", "a\"b\\c\nd")], f64::INFINITY);
        e.gauge("g", "G.", &[], f64::NAN);
        let text = e.finish();
        assert!(text.contains("g{l=\"a\\\"b\\\\c\\nd\"} +Inf\n"), "{text}");
        assert!(text.contains("\ng NaN\n"), "{text}");
    }
}
