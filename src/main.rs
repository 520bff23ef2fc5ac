fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, file) = match uvspan::config::parse(&argv, &|name| std::env::var_os(name)) {
        Ok(x) => x,
        Err(e) => match e.downcast::<clap::Error>() {
            Ok(e) if !e.use_stderr() => e.exit(), // --help, --version
            Ok(e) => {
                // One line, like every other uvspan error.
                let text = e.to_string();
                let first = text.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
                let valid = match e.get(clap::error::ContextKind::ValidValue) {
                    Some(clap::error::ContextValue::Strings(v)) => format!(": one of {}", v.join(", ")),
                    _ => String::new(),
                };
                eprintln!("uvspan: {first}{valid} (see uvspan --help)");
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("uvspan: {e:#}");
                std::process::exit(2);
            }
        },
    };
    uvspan::symbols::set_cache_dir(cli.symbol_cache_dir());
    let result = match &cli.sub {
        Some(uvspan::cli::Sub::Probes { pid, path, json, detail, requests }) => {
            let on = *requests != uvspan::cli::RequestsMode::Off;
            let detail = uvspan::probes::catalog::Detail::from_kinds(detail).with_requests(on);
            uvspan::probes::report::run(*pid, path.as_deref(), *json, detail).map(|()| 0)
        }
        Some(uvspan::cli::Sub::Run(_)) | None => uvspan::agent::run(cli, file),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            // One line: what went wrong, why, what to do.
            eprintln!("uvspan: {e:#}");
            e.downcast_ref::<uvspan::discover::target::ExitCodeError>().map_or(1, |x| x.code)
        }
    };
    std::process::exit(code);
}
