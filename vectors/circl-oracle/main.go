// Command circl-oracle drives Cloudflare CIRCL's tkn20 (v1.6.5) for
// keyfence's interoperability, differential and benchmark tests. Every key
// and ciphertext file is in CIRCL's own binary format. With --seed, random
// bytes come from SHAKE256(seed) so runs are reproducible and keyfence can
// feed the same bytes to its own implementation.
package main

import (
	"bufio"
	"crypto/sha3"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
		"sort"
	"strings"
	"time"

	"github.com/cloudflare/circl/abe/cpabe/tkn20"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: circl-oracle setup|keygen|encrypt|decrypt|inspect|policy-eval|gen-policy-cases|bench ...")
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "setup":
		err = setup(args)
	case "keygen":
		err = keygen(args)
	case "encrypt":
		err = encrypt(args)
	case "decrypt":
		err = decrypt(args)
	case "inspect":
		err = inspect(args)
	case "policy-eval":
		err = policyEval(os.Stdin, os.Stdout)
	case "gen-policy-cases":
		err = genCases(args)
	case "bench":
		err = bench(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "circl-oracle:", msg)
	os.Exit(1)
}

// source returns SHAKE256(seed) as a reader, or nil (CIRCL then uses
// crypto/rand) when no seed is given.
func source(seedHex string) (io.Reader, error) {
	if seedHex == "" {
		return nil, nil
	}
	seed, err := hex.DecodeString(seedHex)
	if err != nil {
		return nil, fmt.Errorf("--seed: %v", err)
	}
	h := sha3.NewSHAKE256()
	h.Write(seed)
	return h, nil
}

func parseAttrs(s string) (map[string]string, error) {
	m := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("attribute %q is not label=value", kv)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

type marshaler interface{ MarshalBinary() ([]byte, error) }

func write(path string, m marshaler) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func setup(args []string) error {
	fs := flag.NewFlagSet("setup", flag.ExitOnError)
	pkPath := fs.String("pk", "", "public key output")
	mskPath := fs.String("msk", "", "master secret key output")
	seed := fs.String("seed", "", "hex seed for reproducible randomness")
	fs.Parse(args)
	rnd, err := source(*seed)
	if err != nil {
		return err
	}
	pk, msk, err := tkn20.Setup(rnd)
	if err != nil {
		return err
	}
	if err := write(*pkPath, &pk); err != nil {
		return err
	}
	return write(*mskPath, &msk)
}

func keygen(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ExitOnError)
	mskPath := fs.String("msk", "", "master secret key")
	attrsArg := fs.String("attrs", "", "label=value,...")
	out := fs.String("out", "", "attribute key output")
	seed := fs.String("seed", "", "hex seed")
	fs.Parse(args)
	rnd, err := source(*seed)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(*mskPath)
	if err != nil {
		return err
	}
	var msk tkn20.SystemSecretKey
	if err := msk.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("master secret key: %v", err)
	}
	m, err := parseAttrs(*attrsArg)
	if err != nil {
		return err
	}
	var attrs tkn20.Attributes
	attrs.FromMap(m)
	key, err := msk.KeyGen(rnd, attrs)
	if err != nil {
		return err
	}
	return write(*out, &key)
}

func encrypt(args []string) error {
	fs := flag.NewFlagSet("encrypt", flag.ExitOnError)
	pkPath := fs.String("pk", "", "public key")
	policyArg := fs.String("policy", "", "policy")
	in := fs.String("in", "", "plaintext file")
	out := fs.String("out", "", "ciphertext output")
	seed := fs.String("seed", "", "hex seed")
	fs.Parse(args)
	rnd, err := source(*seed)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(*pkPath)
	if err != nil {
		return err
	}
	var pk tkn20.PublicKey
	if err := pk.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("public key: %v", err)
	}
	var pol tkn20.Policy
	if err := pol.FromString(*policyArg); err != nil {
		return fmt.Errorf("policy: %v", err)
	}
	msg, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	ct, err := pk.Encrypt(rnd, pol, msg)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, ct, 0o600)
}

func decrypt(args []string) error {
	fs := flag.NewFlagSet("decrypt", flag.ExitOnError)
	keyPath := fs.String("key", "", "attribute key")
	in := fs.String("in", "", "ciphertext")
	out := fs.String("out", "", "plaintext output")
	fs.Parse(args)
	b, err := os.ReadFile(*keyPath)
	if err != nil {
		return err
	}
	var key tkn20.AttributeKey
	if err := key.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("attribute key: %v", err)
	}
	ct, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	pt, err := key.Decrypt(ct)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, pt, 0o600)
}

func inspect(args []string) error {
	fs := flag.NewFlagSet("inspect", flag.ExitOnError)
	in := fs.String("in", "", "ciphertext")
	fs.Parse(args)
	ct, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var pol tkn20.Policy
	if err := pol.ExtractFromCiphertext(ct); err != nil {
		return err
	}
	fmt.Println(pol.String())
	return nil
}

type evalCase struct {
	Policy string            `json:"policy"`
	Attrs  map[string]string `json:"attrs"`
}

type evalResult struct {
	OK        bool   `json:"ok"`
	Satisfied bool   `json:"satisfied"`
	Error     string `json:"error,omitempty"`
}

// policyEval answers, for each JSON line, whether CIRCL parses the policy
// and whether the attributes satisfy it (CIRCL's own Satisfaction).
func policyEval(r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		var c evalCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return err
		}
		var pol tkn20.Policy
		if err := pol.FromString(c.Policy); err != nil {
			enc.Encode(evalResult{OK: false, Error: err.Error()})
			continue
		}
		var attrs tkn20.Attributes
		attrs.FromMap(c.Attrs)
		enc.Encode(evalResult{OK: true, Satisfied: pol.Satisfaction(attrs)})
	}
	return sc.Err()
}

// genCases writes random policies in CIRCL's grammar with random attribute
// maps: small alphabets so that repeated labels and negations are common.
func genCases(args []string) error {
	fs := flag.NewFlagSet("gen-policy-cases", flag.ExitOnError)
	n := fs.Int("n", 1000, "number of cases")
	seed := fs.Int64("seed", 1, "seed")
	fs.Parse(args)
	rng := rand.New(rand.NewSource(*seed))
	labels := []string{"a", "b", "c", "region", "tier"}
	values := []string{"x", "y", "z", "EU", "1"}
	var gen func(depth int) string
	gen = func(depth int) string {
		k := rng.Intn(10)
		switch {
		case depth >= 5 || k < 4:
			lit := labels[rng.Intn(len(labels))] + ": " + values[rng.Intn(len(values))]
			if rng.Intn(4) == 0 {
				lit = "not " + lit
			}
			return lit
		case k < 6:
			return "not (" + gen(depth+1) + ")"
		case k < 8:
			return gen(depth+1) + " and " + gen(depth+1)
		default:
			return "(" + gen(depth+1) + ") or " + gen(depth+1)
		}
	}
	enc := json.NewEncoder(os.Stdout)
	for i := 0; i < *n; i++ {
		attrs := map[string]string{}
		for _, l := range labels {
			if rng.Intn(3) > 0 {
				attrs[l] = values[rng.Intn(len(values))]
			}
		}
		enc.Encode(evalCase{Policy: gen(0), Attrs: attrs})
	}
	return nil
}

type benchCase struct {
	name, policy string
	attrs        map[string]string
}

func clauses(n int, neg bool, op string) (string, map[string]string) {
	parts := make([]string, n)
	attrs := map[string]string{}
	for i := 0; i < n; i++ {
		attrs[fmt.Sprintf("a%d", i)] = fmt.Sprintf("v%d", i)
		if neg && i%2 == 1 {
			parts[i] = fmt.Sprintf("not a%d: x%d", i, i)
		} else {
			parts[i] = fmt.Sprintf("a%d: v%d", i, i)
		}
	}
	return strings.Join(parts, op), attrs
}

func benchCases() []benchCase {
	and50, a := clauses(50, false, " and ")
	or50, _ := clauses(50, false, " or ")
	neg, _ := clauses(50, true, " and ")
	return []benchCase{
		{"small", "country: US or region: EU", map[string]string{"country": "FR", "region": "EU"}},
		{"and50", and50, a},
		{"or50", or50, a},
		{"and50neg25", neg, a},
	}
}

func median(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)/2].Nanoseconds()) / 1e6
}

// bench times CIRCL on the benchmark cases and prints one JSON object per
// case: median milliseconds of keygen, encrypt and decrypt.
func bench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	iters := fs.Int("iters", 20, "iterations per operation")
	fs.Parse(args)
	msg := []byte("a 23-byte test message!")
	pk, msk, err := tkn20.Setup(nil)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, c := range benchCases() {
		var pol tkn20.Policy
		if err := pol.FromString(c.policy); err != nil {
			return err
		}
		var attrs tkn20.Attributes
		attrs.FromMap(c.attrs)
		var kg, en, de []time.Duration
		var key tkn20.AttributeKey
		var ct []byte
		for i := 0; i < *iters; i++ {
			t := time.Now()
			key, err = msk.KeyGen(nil, attrs)
			kg = append(kg, time.Since(t))
			if err != nil {
				return err
			}
			t = time.Now()
			ct, err = pk.Encrypt(nil, pol, msg)
			en = append(en, time.Since(t))
			if err != nil {
				return err
			}
			t = time.Now()
			pt, err := key.Decrypt(ct)
			de = append(de, time.Since(t))
			if err != nil || string(pt) != string(msg) {
				return fmt.Errorf("%s: decryption failed: %v", c.name, err)
			}
		}
		enc.Encode(map[string]any{
			"case": c.name, "keygen_ms": median(kg), "encrypt_ms": median(en),
			"decrypt_ms": median(de), "ct_overhead": len(ct) - len(msg),
		})
	}
	return nil
}
