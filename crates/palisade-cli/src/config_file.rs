//! `palisade serve --config FILE`: the node's flags in a TOML file.
//!
//! A key is a long flag of `serve` (`data-dir = "/var/lib/palisade"`,
//! `initial-cluster = "1=10.0.0.1:7420,…"`, `insecure = true`). A flag on the
//! command line wins over its `PALISADE_*` variable, which wins over the file,
//! which wins over the default. The file is turned into flags and parsed by the
//! same parser as the command line, so it is checked exactly as flags are; an
//! unknown key is an error, not silently ignored.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;

/// `args` with the config file's settings added as flags, for those not given
/// on the command line or in the environment. Unchanged when the command is
/// not `serve --config …`, or does not parse (the real parse then says why).
///
/// # Errors
/// A message for the user (exit status 2) when the file cannot be read, is
/// not TOML, or has a key that is not a flag of `serve`.
pub fn merge(command: clap::Command, args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Ok(matches) = command.clone().try_get_matches_from(&args) else {
        return Ok(args);
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(args);
    };
    let Some(path) = serve.get_one::<PathBuf>("config") else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    let serve_command = command
        .find_subcommand("serve")
        .expect("serve is a subcommand");
    let mut merged = args;
    for (key, value) in table {
        let id = key.replace('-', "_");
        let known = serve_command
            .get_arguments()
            .any(|a| a.get_id() == id.as_str() && a.get_long().is_some() && id != "config");
        if !known {
            return Err(format!(
                "config file {}: unknown key {key:?} (keys are serve's long flags, such as data-dir)",
                path.display()
            ));
        }
        if matches!(
            serve.value_source(&id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let flag = format!("--{}", id.replace('_', "-"));
        let as_text = |v: &toml::Value| match v {
            toml::Value::String(s) => Ok(s.clone()),
            toml::Value::Integer(i) => Ok(i.to_string()),
            toml::Value::Float(f) => Ok(f.to_string()),
            other => Err(format!(
                "config file {}: {key} = {other}: expected a string or a number",
                path.display()
            )),
        };
        match &value {
            toml::Value::Boolean(true) => merged.push(flag.into()),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(as_text).collect::<Result<_, _>>()?;
                merged.push(format!("{flag}={}", items.join(",")).into());
            }
            other => merged.push(format!("{flag}={}", as_text(other)?).into()),
        }
    }
    Ok(merged)
}
