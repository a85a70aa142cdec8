// Command circl-oracle drives Cloudflare CIRCL's CP-ABE scheme
// (github.com/cloudflare/circl/abe/cpabe/tkn20, pinned at v1.6.5) from the
// command line, so that keyfence's Rust tests can check byte compatibility,
// run differential tests of the policy language, and compare speed.
//
// Every key and ciphertext file holds raw bytes in CIRCL's own
// MarshalBinary format. Errors go to stderr and exit with status 1.
//
// With --seed HEX, the randomness CIRCL consumes is SHAKE256(seed bytes),
// read as one stream; the same seed always gives the same bytes, and a
// second implementation fed the same stream must produce identical output.
// Without --seed, CIRCL uses crypto/rand.
package main

import (
	"crypto/sha3"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

const usage = `usage: circl-oracle COMMAND [flags]

commands:
  setup    --pk FILE --msk FILE [--seed HEX]
  keygen   --msk FILE --attrs 'k=v,k=v' --out FILE [--seed HEX]
  encrypt  --pk FILE --policy POLICY --in FILE --out FILE [--seed HEX]
  decrypt  --key FILE --in FILE --out FILE
  inspect  --in FILE
  policy-eval                      JSON lines on stdin -> verdicts on stdout
  gen-policy-cases --n N --seed S  random JSON-line cases for policy-eval
  bench    [--cases small,and50,or50,and50neg25] [--iters N] [--json]

Run 'circl-oracle COMMAND -h' for the flags of one command.
`

// commands maps each subcommand to its implementation; each receives the
// arguments after the command name.
var commands = map[string]func(args []string) error{
	"setup":            cmdSetup,
	"keygen":           cmdKeygen,
	"encrypt":          cmdEncrypt,
	"decrypt":          cmdDecrypt,
	"inspect":          cmdInspect,
	"policy-eval":      cmdPolicyEval,
	"gen-policy-cases": cmdGenPolicyCases,
	"bench":            cmdBench,
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(1)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(usage)
		return
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "circl-oracle: unknown command %q\n\n%s", name, usage)
		os.Exit(1)
	}
	err := cmd(os.Args[2:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "circl-oracle %s: %v\n", name, err)
		os.Exit(1)
	}
}

// newFlags returns a flag set for command name that reports errors to the
// caller instead of exiting with flag's own status code.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("circl-oracle "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// parseFlags parses args into fs, rejects positional arguments, and checks
// that every flag named in required was given a non-empty value.
func parseFlags(fs *flag.FlagSet, args []string, required ...string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, name := range required {
		if fs.Lookup(name).Value.String() == "" {
			return fmt.Errorf("--%s is required", name)
		}
	}
	return nil
}

// randomness returns the reader CIRCL should draw from: SHAKE256 of the
// hex-decoded seed, or nil (meaning crypto/rand) when seedHex is empty.
func randomness(seedHex string) (io.Reader, error) {
	if seedHex == "" {
		return nil, nil
	}
	seed, err := hex.DecodeString(seedHex)
	if err != nil {
		return nil, fmt.Errorf("--seed: %v", err)
	}
	xof := sha3.NewSHAKE256()
	xof.Write(seed)
	return xof, nil
}

// parseAttrs reads "label=value,label=value" into a map. Spaces around
// labels and values are trimmed; an empty string means no attributes.
func parseAttrs(s string) (map[string]string, error) {
	attrs := make(map[string]string)
	if strings.TrimSpace(s) == "" {
		return attrs, nil
	}
	for _, pair := range strings.Split(s, ",") {
		label, value, ok := strings.Cut(pair, "=")
		label, value = strings.TrimSpace(label), strings.TrimSpace(value)
		switch {
		case !ok:
			return nil, fmt.Errorf("--attrs: %q is not label=value", pair)
		case label == "":
			return nil, fmt.Errorf("--attrs: empty label in %q", pair)
		}
		if _, dup := attrs[label]; dup {
			return nil, fmt.Errorf("--attrs: label %q given twice", label)
		}
		attrs[label] = value
	}
	return attrs, nil
}

// unmarshaler is what every CIRCL key type implements.
type unmarshaler interface{ UnmarshalBinary([]byte) error }

// readInto loads a file in CIRCL's binary format into v; what names the
// file's role in error messages.
func readInto(path, what string, v unmarshaler) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := v.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("%s %s: %v", what, path, err)
	}
	return nil
}

// writeFrom stores v's binary form at path with permissions perm.
func writeFrom(path string, v interface{ MarshalBinary() ([]byte, error) }, perm os.FileMode) error {
	b, err := v.MarshalBinary()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, perm)
}
