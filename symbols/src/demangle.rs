//! Demangling of C++ (Itanium ABI) and Rust (legacy and v0) symbol names.

/// Demangles `name` if it is a mangled C++ or Rust name; returns it unchanged otherwise.
/// Rust legacy names lose their `::h<hash>` suffix.
pub fn demangle(name: &str) -> String {
    if (name.starts_with("_R") || is_rust_legacy(name))
        && let Ok(d) = rustc_demangle::try_demangle(name)
    {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        // Symbols like `_ZN3foo3barEv.cold` or `.isra.0` carry a clone suffix.
        let (base, suffix) = match name.find('.') {
            Some(i) => name.split_at(i),
            None => (name, ""),
        };
        if let Ok(sym) = cpp_demangle::Symbol::new(base)
            && let Ok(d) = sym.demangle(&cpp_demangle::DemangleOptions::default())
        {
            return format!("{d}{}", clone_suffix(suffix));
        }
    }
    name.to_string()
}

/// `[clone .cold]` like libiberty prints for GCC clone suffixes.
fn clone_suffix(suffix: &str) -> String {
    suffix
        .split('.')
        .filter(|p| !p.is_empty())
        .fold((String::new(), false), |(mut acc, prev_alpha), part| {
            let numeric = part.bytes().all(|b| b.is_ascii_digit());
            if numeric && prev_alpha {
                acc.insert_str(acc.len() - 1, &format!(".{part}"));
                (acc, false)
            } else {
                acc.push_str(&format!(" [clone .{part}]"));
                (acc, !numeric)
            }
        })
        .0
}

/// `_ZN...17h<16 hex>E`: the hash Rust appends to legacy mangled names.
fn is_rust_legacy(name: &str) -> bool {
    let Some(inner) = name.strip_prefix("_ZN") else {
        return false;
    };
    let inner = inner.split('.').next().unwrap_or(inner);
    let Some(body) = inner.strip_suffix('E') else {
        return false;
    };
    body.len() > 19
        && body[body.len() - 19..].starts_with("17h")
        && body[body.len() - 16..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_cpp_rust_and_leaves_c_alone() {
        assert_eq!(demangle("malloc"), "malloc");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_ZN2ns4workIiEEiT_"), "int ns::work<int>(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h5b1f4c5e0d2a9b7cE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_ZN3foo3barEv.cold"), "foo::bar() [clone .cold]");
        assert_eq!(
            demangle("_ZN3foo3barEv.isra.0"),
            "foo::bar() [clone .isra.0]"
        );
        // Not a valid mangling: returned as is, no panic.
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_ZN"), "_ZN");
    }
}
