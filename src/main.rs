use clap::Parser;

fn main() {
    let cli = uvspan::cli::Cli::parse();
    let result = match &cli.sub {
        Some(uvspan::cli::Sub::Probes { pid, path, json }) => {
            uvspan::probes::list::run(*pid, path.as_deref(), *json).map(|()| 0)
        }
        None => uvspan::run::run(cli),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            // One line: what went wrong, why, what to do.
            eprintln!("uvspan: {e:#}");
            e.downcast_ref::<uvspan::target::ExitCodeError>().map_or(1, |x| x.code)
        }
    };
    std::process::exit(code);
}
