package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cloudflare/circl/abe/cpabe/tkn20"
)

// benchMsg is the 23-byte message of CIRCL's own tkn20 benchmarks.
var benchMsg = []byte("drink your ovaltine now")

// benchCase is a policy and a key that satisfies it.
type benchCase struct {
	policy string
	attrs  map[string]string
}

// clauses joins n clauses "aI: vI" with op and returns the key a0=v0,...;
// with negate, every odd clause becomes "not aI: xI" (still satisfied).
func clauses(n int, op string, negate bool) benchCase {
	parts := make([]string, n)
	attrs := make(map[string]string, n)
	for i := range n {
		attrs[fmt.Sprintf("a%d", i)] = fmt.Sprintf("v%d", i)
		parts[i] = fmt.Sprintf("a%d: v%d", i, i)
		if negate && i%2 == 1 {
			parts[i] = fmt.Sprintf("not a%d: x%d", i, i)
		}
	}
	return benchCase{strings.Join(parts, " "+op+" "), attrs}
}

// circlLong is the 50-clause policy of CIRCL's bench_test.go: kI:vI with
// "and" and "or" alternating.
func circlLong() benchCase {
	var b strings.Builder
	attrs := make(map[string]string, 50)
	for i := range 50 {
		attrs[fmt.Sprintf("k%d", i)] = fmt.Sprintf("v%d", i)
		fmt.Fprintf(&b, "k%d:v%d", i, i)
		if i < 49 {
			b.WriteString([]string{" and ", " or "}[i%2])
		}
	}
	return benchCase{b.String(), attrs}
}

// benchCases are the shapes bench knows. The first four are the defaults;
// circl-small and circl-long are exactly the cases in CIRCL's bench_test.go.
var benchCases = map[string]benchCase{
	"small":       {"country: US or region: EU", map[string]string{"country": "FR", "region": "EU"}},
	"and50":       clauses(50, "and", false),
	"or50":        clauses(50, "or", false),
	"and50neg25":  clauses(50, "and", true),
	"circl-small": {"(k1:v1 or k1:v2) and not k2:v3", map[string]string{"k1": "v2", "k2": "v4"}},
	"circl-long":  circlLong(),
}

// benchResult is one line of bench --json.
type benchResult struct {
	Case      string  `json:"case"`
	KeygenMs  float64 `json:"keygen_ms"`
	EncryptMs float64 `json:"encrypt_ms"`
	DecryptMs float64 `json:"decrypt_ms"`
	// DecryptColdMs is a decryption from the key's bytes: unmarshal, then
	// decrypt, as a process that loads a key to decrypt once pays.
	DecryptColdMs float64 `json:"decrypt_cold_ms"`
	CtOverhead    int     `json:"ct_overhead"`
}

// cmdBench times CIRCL's keygen, encrypt and decrypt separately on each
// case (one setup for all) and reports the median of --iters runs.
func cmdBench(args []string) error {
	fs := newFlags("bench")
	names := fs.String("cases", "small,and50,or50,and50neg25",
		"comma-separated cases: small, and50, or50, and50neg25, circl-small, circl-long")
	iters := fs.Int("iters", 20, "iterations per operation")
	asJSON := fs.Bool("json", false, "print one JSON object per case")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *iters < 1 {
		return fmt.Errorf("--iters must be at least 1")
	}
	var selected []string
	for name := range strings.SplitSeq(*names, ",") {
		name = strings.TrimSpace(name)
		if _, ok := benchCases[name]; !ok {
			return fmt.Errorf("unknown case %q", name)
		}
		selected = append(selected, name)
	}
	pk, msk, err := tkn20.Setup(nil)
	if err != nil {
		return err
	}
	var results []benchResult
	for _, name := range selected {
		r, err := runBench(&pk, &msk, benchCases[name], *iters)
		if err != nil {
			return fmt.Errorf("case %s: %v", name, err)
		}
		r.Case = name
		if *asJSON {
			// Printed as soon as known, so long runs show progress.
			if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
				return err
			}
		}
		results = append(results, r)
	}
	if !*asJSON {
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "case\tkeygen ms\tencrypt ms\tdecrypt ms\tcold decrypt ms\tct overhead B\t\n")
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t\n",
				r.Case, r.KeygenMs, r.EncryptMs, r.DecryptMs, r.DecryptColdMs, r.CtOverhead)
		}
		return tw.Flush()
	}
	return nil
}

// runBench measures one case; every decryption is checked.
func runBench(pk *tkn20.PublicKey, msk *tkn20.SystemSecretKey, c benchCase, iters int) (benchResult, error) {
	var policy tkn20.Policy
	if err := policy.FromString(c.policy); err != nil {
		return benchResult{}, err
	}
	var attrs tkn20.Attributes
	attrs.FromMap(c.attrs)
	var keygen, encrypt, decrypt, cold []time.Duration
	var ct []byte
	// Decryption uses a key made once, as a machine holds its key (keyfence
	// precomputes per key when it is loaded; CIRCL keeps nothing per key,
	// so this changes nothing for it but keeps the two runs alike).
	dkey, err := msk.KeyGen(nil, attrs)
	if err != nil {
		return benchResult{}, err
	}
	keyBytes, err := dkey.MarshalBinary()
	if err != nil {
		return benchResult{}, err
	}
	for range iters {
		start := time.Now()
		_, err := msk.KeyGen(nil, attrs)
		keygen = append(keygen, time.Since(start))
		if err != nil {
			return benchResult{}, err
		}

		start = time.Now()
		ct, err = pk.Encrypt(nil, policy, benchMsg)
		encrypt = append(encrypt, time.Since(start))
		if err != nil {
			return benchResult{}, err
		}

		start = time.Now()
		pt, err := dkey.Decrypt(ct)
		decrypt = append(decrypt, time.Since(start))
		if err != nil {
			return benchResult{}, fmt.Errorf("decryption failed: %v", err)
		}
		if !bytes.Equal(pt, benchMsg) {
			return benchResult{}, fmt.Errorf("decryption returned the wrong message")
		}

		start = time.Now()
		var fresh tkn20.AttributeKey
		if err := fresh.UnmarshalBinary(keyBytes); err != nil {
			return benchResult{}, err
		}
		pt, err = fresh.Decrypt(ct)
		cold = append(cold, time.Since(start))
		if err != nil || !bytes.Equal(pt, benchMsg) {
			return benchResult{}, fmt.Errorf("decryption from a cold key failed: %v", err)
		}
	}
	return benchResult{
		KeygenMs:      medianMs(keygen),
		EncryptMs:     medianMs(encrypt),
		DecryptMs:     medianMs(decrypt),
		DecryptColdMs: medianMs(cold),
		CtOverhead:    len(ct) - len(benchMsg),
	}, nil
}

// medianMs returns the median of ds in milliseconds.
func medianMs(ds []time.Duration) float64 {
	slices.Sort(ds)
	m := ds[len(ds)/2]
	if len(ds)%2 == 0 {
		m = (ds[len(ds)/2-1] + m) / 2
	}
	return float64(m) / float64(time.Millisecond)
}
