//! Words printed for the user to paste into a shell.

/// `s` as one shell word: as it is when it needs no quoting, else in single quotes (a
/// URI's `?` and `&`, spaces).
pub fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_only_when_needed() {
        assert_eq!(shell_word("/srv/d0.img"), "/srv/d0.img");
        assert_eq!(
            shell_word("nbd+unix:///m?socket=/s"),
            "'nbd+unix:///m?socket=/s'"
        );
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
