//! `lake view`: named training sets, the episodes a SQL query selects.

use std::process::ExitCode;

use lake_query::views;
use lake_store::Lake;

/// Arguments of `lake view`.
#[derive(Debug, clap::Subcommand)]
pub enum ViewCommand {
    /// Store the episodes a query selects as a named training set. The query returns
    /// `episode_index`, `dataset` (optional with one dataset) and optionally `weight`.
    Create {
        /// View name (letters, digits, `.`, `_`, `-`; not a dataset's name).
        name: String,
        /// The SELECT that picks episodes, e.g. "SELECT dataset, episode_index FROM episodes WHERE length > 100".
        query: String,
        /// Replace a view of the same name: the query becomes its next version (streams that
        /// pinned an earlier version keep reading that one).
        #[arg(long)]
        replace: bool,
        /// Samples carry feature FROM as TO: `[DATASET:]FROM=TO` (e.g. `--rename
        /// aloha:actions=action`), for DATASET or every dataset of the view that has FROM.
        /// Repeat for more.
        #[arg(long, value_name = "[DATASET:]FROM=TO", value_parser = |v: &str| views::MappingRule::parse("rename", v))]
        rename: Vec<views::MappingRule>,
        /// Samples carry only these dimensions, in this order, of a one-dimensional feature (its
        /// key after --rename): `[DATASET:]KEY=DIMS`, DIMS like `0:6` (0 to 5) or `0,1,2,7`.
        #[arg(long, value_name = "[DATASET:]KEY=DIMS", value_parser = |v: &str| views::MappingRule::parse("dims", v))]
        dims: Vec<views::MappingRule>,
        /// Samples leave out a feature or camera: `[DATASET:]KEY`.
        #[arg(long, value_name = "[DATASET:]KEY", value_parser = |v: &str| views::MappingRule::parse("drop", v))]
        drop: Vec<views::MappingRule>,
    },
    /// List the views (current versions).
    Ls,
    /// Show one view: its query, the dataset versions it is pinned to and its episodes.
    Show {
        /// View name, or `NAME@VERSION` for an earlier version.
        name: String,
    },
    /// Remove a view (its versions stay readable as `NAME@VERSION` by streams pinned to them).
    Drop {
        /// View name.
        name: String,
    },
}

/// `lake view`.
pub async fn view(root: &str, command: ViewCommand) -> anyhow::Result<ExitCode> {
    let lake = Lake::open(root)?;
    match command {
        ViewCommand::Create { name, query, replace, rename, dims, drop } => {
            // Renames first: cuts name features by the key samples carry.
            let mapping: Vec<views::MappingRule> = rename.into_iter().chain(drop).chain(dims).collect();
            let views::Created { view: v, notes } = views::create(&lake, &name, &query, replace, &mapping).await?;
            let parts: Vec<String> = v
                .datasets
                .iter()
                .map(|d| format!("{}@{}: {}", d.name, d.version, crate::text::count(d.episodes.len() as u64, "episode")))
                .collect();
            outln!(
                "view {}@{} created: {} ({})",
                v.name,
                v.version,
                crate::text::count(v.episode_count() as u64, "episode"),
                parts.join("; ")
            )?;
            for note in notes {
                outln!("  note: {note}")?;
            }
        }
        ViewCommand::Ls => {
            let (all, unreadable) = lake.views_listed().await?;
            for u in &unreadable {
                errln!("warning: view {}@{} is left out: its record {} cannot be read ({})", u.name, u.version, u.path, u.why);
            }
            if all.is_empty() {
                outln!("no views in {}", lake.display_root())?;
            }
            let mut rows: Vec<[String; 4]> = Vec::with_capacity(all.len());
            for v in &all {
                rows.push([
                    format!("{}@{}", v.name, v.version),
                    v.episode_count().to_string(),
                    v.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    lake_loader::views::sources(&lake, v).await.join(", "),
                ]);
            }
            if !rows.is_empty() {
                let width = |i: usize, title: &str| rows.iter().map(|r| r[i].len()).chain([title.len()]).max().unwrap_or(0);
                let (name_w, episodes_w) = (width(0, "view"), width(1, "episodes"));
                outln!("{:<name_w$}  {:>episodes_w$}  {:<19}  datasets", "view", "episodes", "created")?;
                for [name, episodes, created, on] in &rows {
                    outln!("{name:<name_w$}  {episodes:>episodes_w$}  {created:<19}  {on}")?;
                }
            }
        }
        ViewCommand::Show { name } => {
            let (base, version) = match name.rsplit_once('@') {
                Some((base, version)) => (base, Some(version)),
                None => (name.as_str(), None),
            };
            let v = lake_loader::views::view(&lake, base, version)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no view `{name}` in {}", lake.display_root()))?;
            outln!("{}", serde_json::to_string_pretty(&v)?)?;
        }
        ViewCommand::Drop { name } => {
            if let Some((view, version)) = name.split_once('@') {
                anyhow::bail!(
                    "`{name}`: a drop takes the view's name alone (`lake view drop {view}`); it drops the name, and version {version} \
                     stays readable as `{name}`"
                );
            }
            lake.drop_view(&name).await?;
            outln!("view {name} dropped")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
