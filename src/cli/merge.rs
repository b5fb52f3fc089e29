//! The rules every section of `serve`'s configuration shares: how a flag and the config
//! file's value for one option combine (`flag_or_file`, `switch`), and how a size is
//! written (`parse_size`). `config.rs` and `server.rs` both use them; they sit here, below
//! both, so that neither of those two has to import the other's helpers.

/// The flag if given, else the config file's value.
pub(super) fn flag_or_file<T: Clone>(flag: &Option<T>, file: &Option<T>) -> Option<T> {
    flag.as_ref().or(file.as_ref()).cloned()
}

/// An on/off option: `--x` or `--no-x` if given (clap keeps only the last of the two, so
/// `on` and `off` are never both set), else the config file's value, else off.
pub(super) fn switch(on: bool, off: bool, file: Option<bool>) -> bool {
    if on || off {
        on
    } else {
        file.unwrap_or(false)
    }
}

/// `512M`, `2G`, `64MB`, `1GiB`, or bytes.
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("size {text:?}: expected e.g. 512M or 2G"))?;
    let multiplier: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => {
            return Err(format!(
                "size {text:?}: unknown unit {unit:?} (use K, M or G)"
            ))
        }
    };
    number
        .checked_mul(multiplier)
        .filter(|&bytes| bytes >= 16 << 20)
        .ok_or_else(|| format!("size {text:?}: must be at least 16M"))
}
