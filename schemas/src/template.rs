//! LeRobot's path templates: Python `str.format` with named fields and `{name:0Nd}` specs.

use crate::{Error, Result};

/// A value substituted into a [`PathTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateValue {
    /// An integer, formatted with the field's `:0Nd` spec when it has one.
    Int(i64),
    /// A string, inserted as is.
    Str(String),
}

impl From<i64> for TemplateValue {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for TemplateValue {
    fn from(v: &str) -> Self {
        Self::Str(v.to_string())
    }
}

/// A path template from `info.json` (`data_path`, `video_path`), formatted the way Python's
/// `str.format` does for the subset LeRobot uses: `{name}`, `{name:03d}`, `{name:d}`, `{{`/`}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    template: String,
}

impl PathTemplate {
    /// Wraps a template string.
    pub fn new(template: impl Into<String>) -> Self {
        Self { template: template.into() }
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// The field names the template uses, in order of appearance.
    pub fn fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        let _ = self.render(&mut |name, _spec| {
            out.push(name.to_string());
            Ok(String::new())
        });
        out
    }

    /// Formats the template with `values`.
    ///
    /// # Errors
    /// When a field is missing from `values`, a spec is not one LeRobot uses, or braces do not
    /// balance.
    pub fn format(&self, values: &[(&str, TemplateValue)]) -> Result<String> {
        self.render(&mut |name, spec| {
            let value = values
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v)
                .ok_or_else(|| self.error(format!("no value for field `{name}`")))?;
            match value {
                TemplateValue::Str(s) if spec.is_empty() || spec == "s" => Ok(s.clone()),
                TemplateValue::Str(_) => Err(self.error(format!("field `{name}` is a string but has spec `{spec}`"))),
                TemplateValue::Int(i) => {
                    format_int(*i, spec).ok_or_else(|| self.error(format!("unsupported format spec `{spec}` for field `{name}`")))
                }
            }
        })
    }

    fn render(&self, field: &mut dyn FnMut(&str, &str) -> Result<String>) -> Result<String> {
        let mut out = String::with_capacity(self.template.len() + 16);
        let mut chars = self.template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    out.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    out.push('}');
                }
                '{' => {
                    let mut inner = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => inner.push(c),
                            None => return Err(self.error("unclosed `{`")),
                        }
                    }
                    let (name, spec) = inner.split_once(':').unwrap_or((inner.as_str(), ""));
                    if name.is_empty() {
                        return Err(self.error("positional fields are not supported"));
                    }
                    out.push_str(&field(name, spec)?);
                }
                '}' => return Err(self.error("unmatched `}`")),
                c => out.push(c),
            }
        }
        Ok(out)
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error::Template { template: self.template.clone(), message: message.into() }
    }
}

/// Formats an integer with a Python spec of the form `[0][width][d]`.
fn format_int(value: i64, spec: &str) -> Option<String> {
    let spec = spec.strip_suffix('d').unwrap_or(spec);
    if spec.is_empty() {
        return Some(value.to_string());
    }
    let (zero, width) = match spec.strip_prefix('0') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let width: usize = if width.is_empty() { 0 } else { width.parse().ok()? };
    Some(if zero {
        if value < 0 { format!("-{:0>w$}", value.unsigned_abs(), w = width.saturating_sub(1)) } else { format!("{value:0>width$}") }
    } else {
        format!("{value:>width$}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_v3_and_v21_templates() {
        let v3 = PathTemplate::new("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4");
        let path =
            v3.format(&[("video_key", "observation.images.front".into()), ("chunk_index", 1.into()), ("file_index", 7.into())]).unwrap();
        assert_eq!(path, "videos/observation.images.front/chunk-001/file-007.mp4");
        assert_eq!(v3.fields(), ["video_key", "chunk_index", "file_index"]);

        let v21 = PathTemplate::new("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet");
        let path = v21.format(&[("episode_chunk", 0.into()), ("episode_index", 42.into())]).unwrap();
        assert_eq!(path, "data/chunk-000/episode_000042.parquet");
    }

    #[test]
    fn wider_widths_and_escapes() {
        let t = PathTemplate::new("{{x}}/file-{file_index:06d}-{n}-{m:d}");
        let path = t.format(&[("file_index", 3.into()), ("n", 1234567.into()), ("m", (-4).into())]).unwrap();
        assert_eq!(path, "{x}/file-000003-1234567--4");
        assert_eq!(format_int(-5, "03d").unwrap(), "-05");
    }

    #[test]
    fn errors_name_the_template() {
        let t = PathTemplate::new("data/{chunk_index:03d");
        let err = t.format(&[("chunk_index", 0.into())]).unwrap_err().to_string();
        assert!(err.contains("data/{chunk_index:03d") && err.contains("unclosed"), "{err}");
        let t = PathTemplate::new("data/{episode_chunk:03d}");
        let err = t.format(&[("chunk_index", 0.into())]).unwrap_err().to_string();
        assert!(err.contains("no value for field `episode_chunk`"), "{err}");
        let t = PathTemplate::new("data/{chunk_index:.2f}");
        assert!(t.format(&[("chunk_index", 0.into())]).is_err());
    }
}
