//! Recursive-descent parser: `or` < `and` < `not` < term/parentheses,
//! binary operators left associative, as in CIRCL's tkn20 DSL.

use crate::ast::Expr;
use crate::error::{ParseError, ParseErrorKind};
use crate::lexer::{tokenize, Tok, Token};
use crate::limits::{MAX_DEPTH, MAX_LEAVES};

/// Parses policy text into an [`Expr`] without compiling it.
///
/// # Errors
/// A [`ParseError`] with the byte offset of the first problem: an
/// unexpected character or token, text after a complete policy, nesting
/// deeper than [`MAX_DEPTH`], or more terms than [`MAX_LEAVES`].
pub fn parse_expr(src: &str) -> Result<Expr, ParseError> {
    parse_with_offsets(src).map(|(e, _)| e)
}

/// Parses, also returning the byte offset of every term in order.
pub(crate) fn parse_with_offsets(src: &str) -> Result<(Expr, Vec<usize>), ParseError> {
    let tokens = tokenize(src)?;
    let mut p = Parser { tokens, pos: 0, depth: 0, term_offsets: Vec::new() };
    let first = p.peek().offset;
    let expr = p.expression(first)?;
    let t = p.peek();
    match t.tok {
        Tok::Eof => Ok((expr, p.term_offsets)),
        Tok::RParen => Err(ParseError::new(t.offset, ParseErrorKind::UnmatchedClose)),
        _ => Err(p.unexpected("`and`, `or` or end of input")),
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// Nesting counted as CIRCL counts it: one per expression (the whole
    /// policy and each parenthesised group) and one per `not`.
    depth: usize,
    term_offsets: Vec<usize>,
}

impl Parser {
    fn peek(&self) -> &Token {
        // The token list always ends with Eof and `pos` never passes it.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) {
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
    }

    fn unexpected(&self, expected: &'static str) -> ParseError {
        let t = self.peek();
        ParseError::new(t.offset, ParseErrorKind::Unexpected { found: t.tok.describe(), expected })
    }

    fn enter(&mut self, offset: usize) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError::new(offset, ParseErrorKind::TooDeep { limit: MAX_DEPTH }));
        }
        Ok(())
    }

    /// `at` is where a too-deep error points: the `(` that opened the group.
    fn expression(&mut self, at: usize) -> Result<Expr, ParseError> {
        self.enter(at)?;
        let e = self.or();
        self.depth -= 1;
        e
    }

    fn or(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.and()?;
        while self.peek().tok == Tok::Or {
            self.bump();
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.not()?;
        while self.peek().tok == Tok::And {
            self.bump();
            let right = self.not()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, ParseError> {
        if self.peek().tok != Tok::Not {
            return self.primary();
        }
        self.enter(self.peek().offset)?;
        self.bump();
        let inner = self.not();
        self.depth -= 1;
        Ok(Expr::Not(Box::new(inner?)))
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let t = self.peek().clone();
        match t.tok {
            Tok::LParen => {
                self.bump();
                let e = self.expression(t.offset)?;
                match self.peek().tok {
                    Tok::RParen => {
                        self.bump();
                        Ok(e)
                    }
                    _ => Err(self.unexpected("`and`, `or` or `)`")),
                }
            }
            Tok::Word(label) => {
                self.bump();
                if self.peek().tok != Tok::Colon {
                    return Err(self.unexpected("`:` after the label"));
                }
                self.bump();
                let value = match &self.peek().tok {
                    Tok::Word(v) => v.clone(),
                    _ => return Err(self.unexpected("a value after `:`")),
                };
                self.bump();
                self.term_offsets.push(t.offset);
                if self.term_offsets.len() > MAX_LEAVES {
                    return Err(ParseError::new(t.offset, ParseErrorKind::TooManyLeaves { limit: MAX_LEAVES }));
                }
                Ok(Expr::Term { label, value })
            }
            _ => Err(self.unexpected("`(`, `not` or a `label: value` term")),
        }
    }
}
