use clap::Parser;

fn main() {
    let cli = uvspan::cli::Cli::parse();
    let code = match uvspan::run::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: what went wrong, why, what to do.
            eprintln!("uvspan: {e:#}");
            e.downcast_ref::<uvspan::target::ExitCodeError>().map_or(1, |x| x.code)
        }
    };
    std::process::exit(code);
}
