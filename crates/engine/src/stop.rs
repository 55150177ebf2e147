//! Holding back streamed text that may be the start of a stop string, so a stop string is never
//! printed, not even in part.

pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

pub enum Scan {
    /// Text that can be shown now.
    Emit(String),
    /// A stop string was found: the text before it, and generation ends.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Scan {
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return Scan::Stopped(out);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|p| self.pending.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Scan::Emit(out)
    }

    /// Whatever is still held back, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                Scan::Emit(t) => out.push_str(&t),
                Scan::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_split_across_pieces_is_never_shown() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn near_misses_are_released() {
        assert_eq!(
            run(&["END"], &["hello E", "Nx"]),
            ("hello ENx".into(), false)
        );
    }

    #[test]
    fn earliest_stop_wins() {
        assert_eq!(run(&["b", "a"], &["xab"]), ("x".into(), true));
    }

    #[test]
    fn multibyte_stops_work() {
        assert_eq!(run(&["åß"], &["xå", "ß"]), ("x".into(), true));
    }
}
