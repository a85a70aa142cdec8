package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/cloudflare/circl/abe/cpabe/tkn20"
)

// evalCase is one line of policy-eval's input and gen-policy-cases' output.
type evalCase struct {
	Policy string            `json:"policy"`
	Attrs  map[string]string `json:"attrs"`
}

// verdict is one line of policy-eval's output: {"ok":true,"satisfied":B}
// or {"ok":false,"error":"..."}.
type verdict struct {
	OK        bool   `json:"ok"`
	Satisfied *bool  `json:"satisfied,omitempty"`
	Error     string `json:"error,omitempty"`
}

// cmdPolicyEval answers, for each JSON case on stdin, whether CIRCL's parser
// accepts the policy and, if so, whether CIRCL's own Policy.Satisfaction
// holds for the attributes. Input that is not a case (bad JSON, non-string
// attribute values) is a harness bug: it stops the run with an error.
func cmdPolicyEval(args []string) error {
	fs := newFlags("policy-eval")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	dec := json.NewDecoder(bufio.NewReader(os.Stdin))
	enc := json.NewEncoder(os.Stdout) // unbuffered: one write per verdict
	for n := 1; ; n++ {
		var c evalCase
		if err := dec.Decode(&c); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("input case %d: %v", n, err)
		}
		if err := enc.Encode(evaluate(c)); err != nil {
			return err
		}
	}
}

// evaluate runs one case through CIRCL. A panic inside CIRCL is reported as
// a rejection so that the output stays one line per input.
func evaluate(c evalCase) (v verdict) {
	defer func() {
		if r := recover(); r != nil {
			v = verdict{Error: fmt.Sprintf("CIRCL panicked: %v", r)}
		}
	}()
	var policy tkn20.Policy
	if err := policy.FromString(c.Policy); err != nil {
		return verdict{Error: err.Error()}
	}
	var attrs tkn20.Attributes
	attrs.FromMap(c.Attrs)
	sat := policy.Satisfaction(attrs)
	return verdict{OK: true, Satisfied: &sat}
}

// cmdGenPolicyCases writes n random cases for policy-eval. Every policy is
// valid in CIRCL's grammar; the small alphabets make repeated labels,
// negations and both verdicts common. The output depends only on --seed.
func cmdGenPolicyCases(args []string) error {
	fs := newFlags("gen-policy-cases")
	n := fs.Int("n", 1000, "number of cases")
	seed := fs.Uint64("seed", 1, "random seed")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	g := caseGen{rand.New(rand.NewPCG(*seed, 0x6b657966656e6365))}
	w := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(w)
	for range *n {
		if err := enc.Encode(evalCase{Policy: g.policy(0), Attrs: g.attrs()}); err != nil {
			return err
		}
	}
	return w.Flush()
}

// Words the generator draws from. The odd ones, drawn rarely, are still
// plain identifiers to CIRCL's lexer: keywords in the wrong case, digits,
// underscores.
var (
	genLabels    = []string{"a", "b", "c"}
	genValues    = []string{"x", "y", "z"}
	genOddLabels = []string{"AND", "l_1", "9"}
	genOddValues = []string{"Not", "0", "x_y"}
)

// genMaxDepth bounds how deeply parenthesised groups nest.
const genMaxDepth = 5

type caseGen struct{ r *rand.Rand }

// chance reports true with probability 1/n.
func (g caseGen) chance(n int) bool { return g.r.IntN(n) == 0 }

func (g caseGen) pick(words []string) string { return words[g.r.IntN(len(words))] }

func (g caseGen) word(common, odd []string) string {
	if g.chance(25) {
		return g.pick(odd)
	}
	return g.pick(common)
}

// space is the whitespace between two tokens: mostly one space, sometimes
// more or another kind CIRCL's lexer skips.
func (g caseGen) space() string {
	if g.chance(8) {
		return g.pick([]string{"  ", "\t", "\n", "\r\n", " \t "})
	}
	return " "
}

// literal is "label: value", with the colon spaced in varying ways.
func (g caseGen) literal() string {
	colon := ": "
	if g.chance(6) {
		colon = g.pick([]string{":", " :", " : ", ":\t"})
	}
	return g.word(genLabels, genOddLabels) + colon + g.word(genValues, genOddValues)
}

// policy is a chain of one to four operands joined by "and"/"or" without
// parentheses, so precedence and associativity are exercised too.
func (g caseGen) policy(depth int) string {
	n := 1
	if g.r.IntN(genMaxDepth+2) > depth {
		n = 2 + g.r.IntN(3)
	}
	var b strings.Builder
	b.WriteString(g.operand(depth))
	for range n - 1 {
		op := "and"
		if g.chance(2) {
			op = "or"
		}
		b.WriteString(g.space() + op + g.space() + g.operand(depth))
	}
	return b.String()
}

// operand is a literal or a parenthesised group, either of which may be
// negated (occasionally twice).
func (g caseGen) operand(depth int) string {
	var s string
	if depth < genMaxDepth && g.chance(3) {
		s = "(" + g.policy(depth+1) + ")"
	} else {
		s = g.literal()
	}
	for i := 0; i < 2 && g.chance(3+3*i); i++ {
		s = "not" + g.space() + s
	}
	return s
}

// attrs is a random key: each label present with probability 3/4 (odd
// labels rarely), with a random value.
func (g caseGen) attrs() map[string]string {
	m := make(map[string]string)
	for _, l := range genLabels {
		if !g.chance(4) {
			m[l] = g.word(genValues, genOddValues)
		}
	}
	for _, l := range genOddLabels {
		if g.chance(4) {
			m[l] = g.word(genValues, genOddValues)
		}
	}
	return m
}
