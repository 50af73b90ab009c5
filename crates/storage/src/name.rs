//! The naming rules shared by every backend, so a repository can move between them and
//! no name can escape the store's root or collide with a temporary file.

/// Prefix of temporary files of unfinished writes; names may not use it.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// Whether `name` is a valid object name (see [`Storage`](crate::Storage)).
///
/// Backends call this before touching anything.
pub(crate) fn validate_name(name: &str) -> bool {
    !name.is_empty() && name.split('/').all(valid_component)
}

/// Whether `name` is a temporary file's name as backends make them: valid directory
/// components, then a last component of [`TEMP_PREFIX`] and name characters.
pub(crate) fn is_temporary_name(name: &str) -> bool {
    let (dir, file) = name.rsplit_once('/').unwrap_or(("", name));
    (dir.is_empty() || validate_name(dir))
        && file.len() > TEMP_PREFIX.len()
        && file.starts_with(TEMP_PREFIX)
        && file[TEMP_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether one path component (a file or directory name) is allowed.
pub(crate) fn valid_component(component: &str) -> bool {
    !component.is_empty()
        && component != "."
        && component != ".."
        && !component.starts_with(TEMP_PREFIX)
        && component
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usual_repository_names_are_valid() {
        for name in [
            "config",
            "keys/ab12",
            "data/ab/ab12cd",
            "locks/x_y-z.1",
            ".hidden",
        ] {
            assert!(validate_name(name), "{name}");
        }
    }

    #[test]
    fn names_that_could_escape_or_confuse_are_invalid() {
        for name in [
            "",
            "/",
            "/abs",
            "a/",
            "a//b",
            ".",
            "..",
            "a/../b",
            "a/./b",
            "with space",
            "tab\t",
            "back\\slash",
            "ümlaut",
            ".tmp-0123",
            "data/.tmp-x",
            "a\0b",
        ] {
            assert!(!validate_name(name), "{name:?}");
        }
    }
}
