//! The limits that keep any query, however it was built, from taking the process down.
//!
//! DataFusion plans, optimises and evaluates a query by recursion over its trees: a left-deep
//! chain of 10 000 `+1`s, `OR`s or `UNION ALL`s recurses 10 000 frames deep at every stage, and
//! a thread's stack that runs out aborts the whole process (every open stream with it). Some
//! shapes also cost planning time far beyond their size, and planning cannot be interrupted:
//! nested subqueries double the planner's invariant checks with each level, and joins cost
//! the cube of their count. So, before anything recurses over a query:
//!
//! - its text is at most [`MAX_QUERY_BYTES`] ([`check_length`]);
//! - the parser recurses at most [`MAX_PARSER_DEPTH`] deep (parentheses, subqueries and prefix
//!   operators such as `NOT` and `-`, each many parser frames a level);
//! - the parsed statement nests at most [`MAX_DEPTH`] deep, subqueries in expressions at most
//!   [`MAX_SUBQUERY_DEPTH`] deep, and a `FROM` joins at most [`MAX_JOINED`] relations
//!   ([`check_depth`]);
//!
//! and every thread that plans or runs a query has a stack of [`STACK_BYTES`] (`lake sql`'s
//! threads and the server's SQL threads), which holds a query at the limits in a debug build.
//! `docs/decisions/0021-sql-limits.md` has the measurements behind the numbers.
//!
//! Nesting counts what becomes depth in DataFusion's trees: each expression inside another
//! (`1+1+1` is three deep: the chain is left-deep), each query inside another, each set
//! operation (`UNION`, `EXCEPT`, `INTERSECT`) of a chain, each relation a `FROM` joins (a join of
//! n tables is a plan n deep) and each common table expression of a `WITH`.

use std::ops::ControlFlow;

use datafusion::sql::{
    parser::{CopyToSource, Statement as DfStatement},
    sqlparser::ast::{Expr, Query, Select, SetExpr, Visit, Visitor},
};

/// The most bytes of SQL text a query may have.
pub const MAX_QUERY_BYTES: usize = 1 << 20;

/// The deepest nesting a query may have (see the module's documentation for what counts).
pub const MAX_DEPTH: usize = 1000;

/// The deepest the parser may recurse: parentheses, subqueries and prefix operators nest at most
/// about half this deep (each takes two of the parser's levels).
pub const MAX_PARSER_DEPTH: usize = 128;

/// The deepest subqueries in expressions (`(SELECT …)`, `IN (SELECT …)`, `EXISTS (…)`) may nest.
pub const MAX_SUBQUERY_DEPTH: usize = 12;

/// The most relations one `FROM` may join.
pub const MAX_JOINED: usize = 256;

/// The stack of every thread that plans or runs a query: a query at the limits in a debug
/// build, whose frames are several times a release build's, with room to spare. Only the pages
/// a query touches are ever resident.
pub const STACK_BYTES: usize = 256 << 20;

/// Why a query was refused before it was planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The text is longer than [`MAX_QUERY_BYTES`].
    TooLong(usize),
    /// The statement nests deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The parser recursed deeper than [`MAX_PARSER_DEPTH`].
    TooDeepToParse,
    /// Subqueries in expressions nest deeper than [`MAX_SUBQUERY_DEPTH`].
    SubqueriesTooDeep,
    /// A `FROM` joins more than [`MAX_JOINED`] relations.
    TooManyJoined(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLong(bytes) => write!(
                f,
                "the query is {bytes} bytes long, over the limit of {MAX_QUERY_BYTES} bytes (1 MiB); select with a join or a view \
                 rather than a long literal list"
            ),
            Self::TooDeep => write!(
                f,
                "expression nested deeper than {MAX_DEPTH}: the query nests expressions, subqueries, set operations (UNION), joins \
                 or WITH tables more than {MAX_DEPTH} levels deep; write a long chain of OR as IN (…), and split a long UNION or join"
            ),
            Self::TooDeepToParse => write!(
                f,
                "expression nested deeper than the parser's limit of {MAX_PARSER_DEPTH}: parentheses, subqueries and prefix \
                 operators (NOT, -) nest at most {} levels deep",
                MAX_PARSER_DEPTH / 2
            ),
            Self::SubqueriesTooDeep => write!(
                f,
                "subqueries nested deeper than {MAX_SUBQUERY_DEPTH}: a subquery in an expression ((SELECT …), IN (SELECT …), \
                 EXISTS (…)) may hold others at most {MAX_SUBQUERY_DEPTH} levels deep; use WITH tables or joins instead"
            ),
            Self::TooManyJoined(n) => write!(f, "a FROM joins {n} relations, more than the limit of {MAX_JOINED}"),
        }
    }
}

/// Refuses a query text longer than [`MAX_QUERY_BYTES`], before it is parsed.
pub fn check_length(query: &str) -> Result<(), Refused> {
    if query.len() > MAX_QUERY_BYTES { Err(Refused::TooLong(query.len())) } else { Ok(()) }
}

/// Refuses a statement past [`MAX_DEPTH`], [`MAX_SUBQUERY_DEPTH`] or [`MAX_JOINED`]. The walk
/// stops at the first level past a limit, so it never recurses deeper than that itself.
pub fn check_depth(statement: &DfStatement) -> Result<(), Refused> {
    let mut depth = Depth::default();
    let walked = match statement {
        DfStatement::Statement(statement) => statement.visit(&mut depth),
        DfStatement::Explain(explain) => return check_depth(&explain.statement),
        DfStatement::CopyTo(copy) => match &copy.source {
            CopyToSource::Query(query) => query.visit(&mut depth),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        DfStatement::CreateExternalTable(_) | DfStatement::Reset(_) => ControlFlow::Continue(()),
    };
    match walked {
        ControlFlow::Break(refused) => Err(refused),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The nesting of the node being visited, what each open node added to it, and how many
/// subqueries in expressions enclose it.
#[derive(Default)]
struct Depth {
    now: usize,
    added: Vec<usize>,
    subqueries: usize,
}

impl Depth {
    fn enter(&mut self, levels: usize) -> ControlFlow<Refused> {
        self.added.push(levels);
        self.now += levels;
        if self.now > MAX_DEPTH { ControlFlow::Break(Refused::TooDeep) } else { ControlFlow::Continue(()) }
    }

    fn leave(&mut self) -> ControlFlow<Refused> {
        self.now -= self.added.pop().unwrap_or(0);
        ControlFlow::Continue(())
    }
}

/// Whether `expr` holds a subquery of its own (the planner's subquery expressions).
fn is_subquery(expr: &Expr) -> bool {
    matches!(expr, Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. })
        || matches!(expr, Expr::AnyOp { right, .. } | Expr::AllOp { right, .. } if matches!(**right, Expr::Subquery(_)))
}

impl Visitor for Depth {
    type Break = Refused;

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Refused> {
        if is_subquery(expr) {
            self.subqueries += 1;
            if self.subqueries > MAX_SUBQUERY_DEPTH {
                return ControlFlow::Break(Refused::SubqueriesTooDeep);
            }
        }
        self.enter(1)
    }

    fn post_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Refused> {
        if is_subquery(expr) {
            self.subqueries -= 1;
        }
        self.leave()
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Refused> {
        let ctes = query.with.as_ref().map_or(0, |with| with.cte_tables.len());
        self.enter(1 + ctes + set_operations(&query.body))
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<Refused> {
        self.leave()
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<Refused> {
        let joined = select.from.iter().map(|from| from.joins.len() + 1).sum();
        if joined > MAX_JOINED {
            return ControlFlow::Break(Refused::TooManyJoined(joined));
        }
        self.enter(joined)
    }

    fn post_visit_select(&mut self, _: &Select) -> ControlFlow<Refused> {
        self.leave()
    }
}

/// The longest chain of set operations in `body` (a query's own, not those of queries nested
/// in it), counted without recursion: the visitor only walks a chain once it fits.
fn set_operations(body: &SetExpr) -> usize {
    let mut deepest = 0;
    let mut open = vec![(body, 0usize)];
    while let Some((node, depth)) = open.pop() {
        deepest = deepest.max(depth);
        if let SetExpr::SetOperation { left, right, .. } = node {
            open.push((left, depth + 1));
            open.push((right, depth + 1));
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParserBuilder;

    use super::*;

    /// The check of `sql`'s statement, on a thread with the stack queries get.
    fn depth_of(sql: &str) -> Result<(), Refused> {
        let sql = sql.to_string();
        let check = move || {
            let mut parser = DFParserBuilder::new(sql.as_str()).with_recursion_limit(MAX_PARSER_DEPTH).build().expect("parser");
            check_depth(&parser.parse_statements().expect("parses").pop_front().expect("one statement"))
        };
        std::thread::Builder::new().stack_size(STACK_BYTES).spawn(check).expect("thread").join().expect("no overflow")
    }

    fn chain(term: &str, separator: &str, n: usize) -> String {
        vec![term; n].join(separator)
    }

    #[test]
    fn chains_up_to_the_limit_pass_and_one_more_is_refused() {
        // `SELECT <chain>`: the select list's expression is one level, the query another.
        let at_limit = MAX_DEPTH - 1;
        for (term, separator) in [("1", " + "), ("true", " OR "), ("'a'", " || ")] {
            assert_eq!(depth_of(&format!("SELECT {}", chain(term, separator, at_limit))), Ok(()), "{separator}");
            assert_eq!(depth_of(&format!("SELECT {}", chain(term, separator, at_limit + 1))), Err(Refused::TooDeep), "{separator}");
        }
        // One query, and one level per UNION in the chain.
        assert_eq!(depth_of(&chain("SELECT 1", " UNION ALL ", MAX_DEPTH - 1)), Ok(()));
        assert_eq!(depth_of(&chain("SELECT 1", " UNION ALL ", MAX_DEPTH + 1)), Err(Refused::TooDeep));
    }

    #[test]
    fn joins_and_with_tables_count_as_depth() {
        let tables = |n: usize| (0..n).map(|i| format!("t AS t{i}")).collect::<Vec<_>>().join(", ");
        assert_eq!(depth_of(&format!("SELECT 1 FROM {}", tables(MAX_JOINED))), Ok(()));
        assert_eq!(depth_of(&format!("SELECT 1 FROM {}", tables(MAX_JOINED + 1))), Err(Refused::TooManyJoined(MAX_JOINED + 1)));
        let joins = |n: usize| (1..n).map(|i| format!("JOIN t AS t{i} ON true")).collect::<Vec<_>>().join(" ");
        assert_eq!(depth_of(&format!("SELECT 1 FROM t {}", joins(MAX_JOINED + 1))), Err(Refused::TooManyJoined(MAX_JOINED + 1)));
        let ctes = |n: usize| (0..n).map(|i| format!("c{i} AS (SELECT 1)")).collect::<Vec<_>>().join(", ");
        assert_eq!(depth_of(&format!("WITH {} SELECT 1", ctes(MAX_DEPTH + 1))), Err(Refused::TooDeep));
        // Wide is not deep: many columns, a long IN list and many CASE arms are fine.
        assert_eq!(depth_of(&format!("SELECT {}", chain("1 + 1", ", ", 5 * MAX_DEPTH))), Ok(()));
        assert_eq!(depth_of(&format!("SELECT 1 IN ({})", chain("1", ", ", 100 * MAX_DEPTH))), Ok(()));
        assert_eq!(depth_of(&format!("SELECT CASE {} END", chain("WHEN true THEN 1", " ", 5 * MAX_DEPTH))), Ok(()));
    }

    #[test]
    fn subqueries_in_expressions_nest_at_most_their_limit() {
        let nested = |n: usize| format!("SELECT {}1{}", "(SELECT ".repeat(n), ")".repeat(n));
        assert_eq!(depth_of(&nested(MAX_SUBQUERY_DEPTH)), Ok(()));
        assert_eq!(depth_of(&nested(MAX_SUBQUERY_DEPTH + 1)), Err(Refused::SubqueriesTooDeep));
        let exists = |n: usize| format!("SELECT 1 WHERE {}true{}", "EXISTS (SELECT 1 WHERE ".repeat(n), ")".repeat(n));
        assert_eq!(depth_of(&exists(MAX_SUBQUERY_DEPTH)), Ok(()));
        assert_eq!(depth_of(&exists(MAX_SUBQUERY_DEPTH + 1)), Err(Refused::SubqueriesTooDeep));
        // Side by side, subqueries do not nest.
        assert_eq!(depth_of(&format!("SELECT {}", vec!["(SELECT 1)"; 4 * MAX_SUBQUERY_DEPTH].join(", "))), Ok(()));
    }

    #[test]
    fn a_chain_far_past_the_limit_is_refused_without_walking_it() {
        // 100 000 terms: the walk stops at the limit.
        assert_eq!(depth_of(&format!("SELECT {}", chain("1 = 1", " AND ", 100_000))), Err(Refused::TooDeep));
        assert!(check_length(&"x".repeat(MAX_QUERY_BYTES)).is_ok());
        assert_eq!(check_length(&"x".repeat(MAX_QUERY_BYTES + 1)), Err(Refused::TooLong(MAX_QUERY_BYTES + 1)));
    }
}
