//! The user's config file, `$XDG_CONFIG_HOME/cairn/config.toml`: named repositories
//! (`cairn -r @nas`), each with its address and where its password comes from, and the
//! name of the one to use when no repository is given.
//!
//! ```toml
//! default = "nas"
//!
//! [repos.nas]
//! address = "sftp://backup@nas/srv/cairn"
//! password-command = "pass show cairn"   # or password-file = "/path"
//!
//! [repos.box]
//! address = "rest:https://backup.example:8443/laptop"
//! password-file = "box.pw"                # relative to this file's directory
//! rest-token-file = "box.token"           # the server's token, unless CAIRN_REST_TOKEN
//! ```
//!
//! The file is edited through `toml_edit`, so that the comments and layout a person wrote
//! survive `cairn config repo add/remove`. This module reads and writes that one file; it
//! never opens a repository nor runs a password command.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

const DEFAULT_KEY: &str = "default";
const REPOS_KEY: &str = "repos";
const JOBS_KEY: &str = "jobs";
const ADDRESS_KEY: &str = "address";
const PASSWORD_COMMAND_KEY: &str = "password-command";
const PASSWORD_FILE_KEY: &str = "password-file";
const REST_TOKEN_FILE_KEY: &str = "rest-token-file";

/// Where a named repository's password comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// The first line of this file.
    File(PathBuf),
    /// The first line this shell command prints.
    Command(String),
}

/// One `[repos.NAME]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoEntry {
    pub name: String,
    /// A path, `s3:...` or `sftp:...`, as `-r` takes it.
    pub address: String,
    /// None: the password comes from the command line, the environment or a prompt.
    pub password: Option<PasswordSource>,
    /// For a `rest:` address: a file whose first line is the server's token, used when
    /// `CAIRN_REST_TOKEN` is not set.
    pub rest_token_file: Option<PathBuf>,
}

/// The config file, as read, with the edits made since.
pub struct ConfigFile {
    path: PathBuf,
    doc: DocumentMut,
    default: Option<String>,
    repos: BTreeMap<String, RepoEntry>,
}

/// `$XDG_CONFIG_HOME/cairn/config.toml` (or the platform's equivalent).
pub fn default_path() -> Result<PathBuf> {
    let dir = dirs::config_dir()
        .context("No config directory for cairn's config file: set XDG_CONFIG_HOME")?;
    Ok(dir.join("cairn").join("config.toml"))
}

/// Whether `name` can name a repository: the characters of a TOML bare key (letters,
/// digits, `-`, `_`), so that the file needs no quoting and `@NAME` no shell escaping.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        bail!("A repository name cannot be empty");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        bail!("Invalid repository name {name:?}: {c:?} is not allowed, use letters, digits, '-' and '_'");
    }
    Ok(())
}

impl ConfigFile {
    /// Reads the config file at `path`; a missing file is an empty config.
    pub fn load(path: &Path) -> Result<ConfigFile> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("Cannot read the config file {}", path.display()))
            }
        };
        let doc: DocumentMut = text
            .parse()
            .with_context(|| format!("The config file {} is not valid TOML", path.display()))?;
        let (default, repos) = read_doc(&doc, path)
            .with_context(|| format!("Invalid config file {}", path.display()))?;
        Ok(ConfigFile {
            path: path.to_path_buf(),
            doc,
            default,
            repos,
        })
    }

    /// Reads the config file at its usual place.
    pub fn load_default() -> Result<ConfigFile> {
        Self::load(&default_path()?)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entries, sorted by name.
    pub fn repos(&self) -> impl Iterator<Item = &RepoEntry> {
        self.repos.values()
    }

    /// The name in `default = "..."`, which need not name an entry (see `default_repo`).
    pub fn default_name(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The entry `default` names, if it is set; an error if it names no entry.
    pub fn default_repo(&self) -> Result<Option<&RepoEntry>> {
        let Some(name) = &self.default else {
            return Ok(None);
        };
        match self.repos.get(name) {
            Some(entry) => Ok(Some(entry)),
            None => bail!(
                "The default repository {name:?} set in {} is not one of its repositories ({}): \
                 run `cairn config repo default NAME` or `cairn config repo default --unset`",
                self.path.display(),
                self.known_names()
            ),
        }
    }

    /// The entry called `name`; the error says which names there are, or how to add one.
    pub fn repo(&self, name: &str) -> Result<&RepoEntry> {
        check_name(name)?;
        if let Some(entry) = self.repos.get(name) {
            return Ok(entry);
        }
        if self.repos.is_empty() {
            bail!(
                "No repository named {name:?}: the config file {} names no repositories; \
                 add one with `cairn config repo add {name} ADDRESS`",
                self.path.display()
            );
        }
        bail!(
            "No repository named {name:?} in the config file {}; known names: {}",
            self.path.display(),
            self.known_names()
        )
    }

    fn known_names(&self) -> String {
        if self.repos.is_empty() {
            return "none".into();
        }
        self.repos.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// Adds `entry`, or replaces the entry of the same name when `replace` is set.
    /// A replaced entry keeps its place and comments in the file.
    pub fn add(&mut self, entry: RepoEntry, replace: bool) -> Result<()> {
        check_name(&entry.name)?;
        check_address(&entry.address)?;
        if self.repos.contains_key(&entry.name) && !replace {
            bail!(
                "The config file {} already has a repository named {:?} ({}): \
                 choose another name, or pass --force to replace it",
                self.path.display(),
                entry.name,
                self.repos[&entry.name].address
            );
        }
        let root = self.doc.as_table_mut();
        if !root.contains_key(REPOS_KEY) {
            // Implicit: no bare `[repos]` header above the `[repos.NAME]` tables.
            let mut repos = Table::new();
            repos.set_implicit(true);
            root.insert(REPOS_KEY, Item::Table(repos));
        }
        let repos_item = root.get_mut(REPOS_KEY).context("`repos` is missing")?;
        // A blank line above a new `[repos.NAME]` header, as a person would write it
        // (`save` drops it at the very top of the file). Not in an inline table, where
        // a line break is not allowed.
        let prefix = if repos_item.is_table() { "\n" } else { "" };
        let repos = repos_item
            .as_table_like_mut()
            .context("`repos` is not a table")?;
        if !repos.contains_key(&entry.name) {
            let mut table = Table::new();
            table.decor_mut().set_prefix(prefix);
            repos.insert(&entry.name, Item::Table(table));
        }
        let table = repos
            .get_mut(&entry.name)
            .and_then(Item::as_table_like_mut)
            .context("The entry is not a table")?;
        set_string(table, ADDRESS_KEY, &entry.address);
        table.remove(PASSWORD_COMMAND_KEY);
        table.remove(PASSWORD_FILE_KEY);
        table.remove(REST_TOKEN_FILE_KEY);
        if let Some(file) = &entry.rest_token_file {
            let file = file.to_str().with_context(|| {
                format!("The token file name {} is not valid UTF-8", file.display())
            })?;
            set_string(table, REST_TOKEN_FILE_KEY, file);
        }
        match &entry.password {
            Some(PasswordSource::Command(cmd)) => set_string(table, PASSWORD_COMMAND_KEY, cmd),
            Some(PasswordSource::File(file)) => {
                let file = file.to_str().with_context(|| {
                    format!(
                        "The password file name {} is not valid UTF-8",
                        file.display()
                    )
                })?;
                set_string(table, PASSWORD_FILE_KEY, file)
            }
            None => {}
        }
        self.repos.insert(entry.name.clone(), entry);
        Ok(())
    }

    /// Removes the entry `name`, and the default if it named that entry (returns whether
    /// it did), so that commands without -r do not fail on a dangling default.
    pub fn remove(&mut self, name: &str) -> Result<bool> {
        self.repo(name)?;
        self.repos.remove(name);
        if let Some(repos) = self
            .doc
            .get_mut(REPOS_KEY)
            .and_then(Item::as_table_like_mut)
        {
            repos.remove(name);
        }
        let was_default = self.default.as_deref() == Some(name);
        if was_default {
            self.set_default(None)?;
        }
        Ok(was_default)
    }

    /// Sets (to an existing entry) or clears the default repository.
    pub fn set_default(&mut self, name: Option<&str>) -> Result<()> {
        match name {
            Some(name) => {
                self.repo(name)?;
                set_string(self.doc.as_table_mut(), DEFAULT_KEY, name);
                self.default = Some(name.to_string());
            }
            None => {
                self.doc.as_table_mut().remove(DEFAULT_KEY);
                self.default = None;
            }
        }
        Ok(())
    }

    /// Writes the file atomically (a private temporary file in the same directory, synced,
    /// then renamed over the old one), creating its directory if needed.
    pub fn save(&self) -> Result<()> {
        // Write through a symlink (dotfiles kept in a repository of their own) rather
        // than replace the link with a file.
        let path = match fs::symlink_metadata(&self.path) {
            Ok(m) if m.file_type().is_symlink() => fs::canonicalize(&self.path)
                .with_context(|| format!("Cannot follow the symlink {}", self.path.display()))?,
            _ => self.path.clone(),
        };
        let dir = path
            .parent()
            .with_context(|| format!("The config file {} has no directory", path.display()))?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("Cannot create the directory {}", dir.display()))?;
        let write = || -> std::io::Result<()> {
            let mut tmp = tempfile::Builder::new()
                .prefix(".config.toml.")
                .permissions(fs::Permissions::from_mode(0o600))
                .tempfile_in(dir)?;
            let text = self.doc.to_string();
            tmp.write_all(text.trim_start_matches('\n').as_bytes())?;
            tmp.as_file().sync_all()?;
            tmp.persist(&path).map_err(|e| e.error)?;
            // The rename is durable only once the directory is.
            fs::File::open(dir)?.sync_all()
        };
        write().with_context(|| format!("Cannot write the config file {}", path.display()))
    }
}

/// An address `-r` would accept; checked without contacting anything.
fn check_address(address: &str) -> Result<()> {
    if address.starts_with('@') {
        bail!("The address {address:?} names another entry: give the repository's address itself (write ./{address} for a local directory of that name)");
    }
    cairn_core::storage::Location::parse(address).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Sets `key` to a string, keeping the comments around an old value.
fn set_string(table: &mut dyn TableLike, key: &str, value: &str) {
    let mut new = Value::from(value);
    if let Some(old) = table.get(key).and_then(Item::as_value) {
        *new.decor_mut() = old.decor().clone();
    }
    table.insert(key, Item::Value(new));
}

type Parsed = (Option<String>, BTreeMap<String, RepoEntry>);

/// The settings in `doc`; every key is checked, since a misspelt `password-file` would
/// otherwise mean a password prompt, or worse, a silently unused setting.
fn read_doc(doc: &DocumentMut, path: &Path) -> Result<Parsed> {
    let mut default = None;
    let mut repos = BTreeMap::new();
    for (key, item) in doc.iter() {
        match key {
            DEFAULT_KEY => {
                let name = item
                    .as_str()
                    .context("`default` must be a string: the name of a repository")?;
                check_name(name)?;
                default = Some(name.to_string());
            }
            REPOS_KEY => {
                let table = item
                    .as_table_like()
                    .context("`repos` must be a table of [repos.NAME] entries")?;
                for (name, item) in table.iter() {
                    check_name(name)?;
                    let entry = read_entry(name, item, path)
                        .with_context(|| format!("In [repos.{name}]"))?;
                    repos.insert(name.to_string(), entry);
                }
            }
            // Read and checked by crate::jobs::config.
            JOBS_KEY => {}
            other => bail!(
                "Unknown setting {other:?}: the file holds `default = \"NAME\"`, [repos.NAME] and [jobs.NAME] tables"
            ),
        }
    }
    Ok((default, repos))
}

fn read_entry(name: &str, item: &Item, path: &Path) -> Result<RepoEntry> {
    let table = item
        .as_table_like()
        .context("A repository entry must be a table")?;
    let mut address = None;
    let mut password = None;
    let mut rest_token_file = None;
    for (key, value) in table.iter() {
        let text = || {
            value
                .as_str()
                .with_context(|| format!("`{key}` must be a string"))
        };
        let source = match key {
            ADDRESS_KEY => {
                address = Some(text()?.to_string());
                continue;
            }
            REST_TOKEN_FILE_KEY => {
                rest_token_file = Some(password_file_path(text()?, path));
                continue;
            }
            PASSWORD_COMMAND_KEY => PasswordSource::Command(text()?.to_string()),
            PASSWORD_FILE_KEY => PasswordSource::File(password_file_path(text()?, path)),
            other => bail!(
                "Unknown setting {other:?}: an entry holds `{ADDRESS_KEY}`, one of \
                 `{PASSWORD_COMMAND_KEY}` or `{PASSWORD_FILE_KEY}`, and for a rest: address \
                 `{REST_TOKEN_FILE_KEY}`"
            ),
        };
        if password.is_some() {
            bail!("Give `{PASSWORD_COMMAND_KEY}` or `{PASSWORD_FILE_KEY}`, not both");
        }
        password = Some(source);
    }
    let address = address.with_context(|| format!("`{ADDRESS_KEY}` is missing"))?;
    check_address(&address)?;
    Ok(RepoEntry {
        name: name.to_string(),
        address,
        password,
        rest_token_file,
    })
}

/// A password file named in the config file: `~/` is the home directory, and a relative
/// path is relative to the config file's directory (not to wherever cairn runs).
fn password_file_path(text: &str, config: &Path) -> PathBuf {
    if let (Some(rest), Some(home)) = (text.strip_prefix("~/"), dirs::home_dir()) {
        return home.join(rest);
    }
    let file = Path::new(text);
    match config.parent() {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("config.toml");
        fs::write(&path, text)?;
        ConfigFile::load(&path)
    }

    fn nas() -> RepoEntry {
        RepoEntry {
            name: "nas".into(),
            address: "sftp://backup@nas/srv/cairn".into(),
            password: Some(PasswordSource::Command("pass show cairn".into())),
            rest_token_file: None,
        }
    }

    #[test]
    fn names_are_toml_bare_keys() {
        assert!(check_name("nas-2_b").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("my nas").is_err());
        assert!(check_name("a.b").is_err());
        assert!(check_name("@nas").is_err());
    }

    #[test]
    fn a_missing_file_is_an_empty_config() {
        let dir = tempfile::tempdir().unwrap();
        let config = ConfigFile::load(&dir.path().join("nope/config.toml")).unwrap();
        assert_eq!(config.repos().count(), 0);
        assert_eq!(config.default_name(), None);
    }

    #[test]
    fn an_added_entry_reads_back_after_saving() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.toml");
        let mut config = ConfigFile::load(&path).unwrap();
        config.add(nas(), false).unwrap();
        config.set_default(Some("nas")).unwrap();
        config.save().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("[repos]\n"),
            "no empty [repos] header: {text}"
        );
        let again = ConfigFile::load(&path).unwrap();
        assert_eq!(again.repos().collect::<Vec<_>>(), vec![&nas()]);
        assert_eq!(again.default_name(), Some("nas"));
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn adding_an_existing_name_needs_replace() {
        let mut config = parse("").unwrap();
        config.add(nas(), false).unwrap();
        assert!(config.add(nas(), false).is_err());
        let other = RepoEntry {
            address: "/srv/other".into(),
            password: None,
            ..nas()
        };
        config.add(other.clone(), true).unwrap();
        assert_eq!(config.repo("nas").unwrap(), &other);
        assert!(!config.doc.to_string().contains("password"));
    }

    #[test]
    fn removing_the_default_entry_clears_the_default() {
        let mut config = parse("default = \"nas\"\n[repos.nas]\naddress = \"/x\"\n").unwrap();
        assert!(config.remove("nas").unwrap());
        assert_eq!(config.default_name(), None);
        assert!(!config.doc.to_string().contains("default"));
        assert!(config.remove("nas").is_err());
    }

    #[test]
    fn misspelt_and_mistyped_settings_are_errors() {
        let err = |text: &str| format!("{:#}", parse(text).err().expect(text));
        assert!(
            err("[repos.nas]\naddress = \"/x\"\npassword_file = \"/p\"\n")
                .contains("password_file")
        );
        assert!(err("[repos.nas]\npassword-file = \"/p\"\n").contains("address"));
        assert!(err("[repos.nas]\naddress = 3\n").contains("address"));
        assert!(err("defualt = \"nas\"\n").contains("defualt"));
        assert!(err(
            "[repos.nas]\naddress = \"/x\"\npassword-file = \"/p\"\npassword-command = \"c\"\n"
        )
        .contains("not both"));
        assert!(err("[repos.nas]\naddress = \"@other\"\n").contains("@other"));
    }

    #[test]
    fn password_files_are_relative_to_the_config_file() {
        assert_eq!(
            password_file_path("pw", Path::new("/c/cairn/config.toml")),
            PathBuf::from("/c/cairn/pw")
        );
        assert_eq!(
            password_file_path("/abs/pw", Path::new("/c/cairn/config.toml")),
            PathBuf::from("/abs/pw")
        );
    }

    #[test]
    fn entries_can_be_added_to_an_inline_table() {
        let mut config = parse("repos = { old = { address = \"/x\" } }\n").unwrap();
        config.add(nas(), false).unwrap();
        let again = parse(&config.doc.to_string()).unwrap();
        assert_eq!(again.repo("nas").unwrap(), &nas());
        assert_eq!(again.repo("old").unwrap().address, "/x");
    }

    #[test]
    fn inline_table_entries_are_read_and_edited() {
        let mut config = parse("repos = { nas = { address = \"/x\" } }\n").unwrap();
        assert_eq!(config.repo("nas").unwrap().address, "/x");
        config.add(nas(), true).unwrap();
        let again = parse(&config.doc.to_string()).unwrap();
        assert_eq!(again.repo("nas").unwrap(), &nas());
    }
}
