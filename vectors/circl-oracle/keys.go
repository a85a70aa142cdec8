package main

import (
	"fmt"
	"os"

	"github.com/cloudflare/circl/abe/cpabe/tkn20"
)

// cmdSetup writes a fresh public key and master secret key (tkn20.Setup).
func cmdSetup(args []string) error {
	fs := newFlags("setup")
	pkPath := fs.String("pk", "", "public key output `file`")
	mskPath := fs.String("msk", "", "master secret key output `file`")
	seed := fs.String("seed", "", "`hex` seed for reproducible randomness")
	if err := parseFlags(fs, args, "pk", "msk"); err != nil {
		return err
	}
	rnd, err := randomness(*seed)
	if err != nil {
		return err
	}
	pk, msk, err := tkn20.Setup(rnd)
	if err != nil {
		return err
	}
	if err := writeFrom(*pkPath, &pk, 0o644); err != nil {
		return err
	}
	return writeFrom(*mskPath, &msk, 0o600)
}

// cmdKeygen derives an attribute key for a set of label=value attributes.
func cmdKeygen(args []string) error {
	fs := newFlags("keygen")
	mskPath := fs.String("msk", "", "master secret key `file`")
	attrsArg := fs.String("attrs", "", "attributes as `label=value,...`")
	out := fs.String("out", "", "attribute key output `file`")
	seed := fs.String("seed", "", "`hex` seed for reproducible randomness")
	if err := parseFlags(fs, args, "msk", "out"); err != nil {
		return err
	}
	rnd, err := randomness(*seed)
	if err != nil {
		return err
	}
	m, err := parseAttrs(*attrsArg)
	if err != nil {
		return err
	}
	var msk tkn20.SystemSecretKey
	if err := readInto(*mskPath, "master secret key", &msk); err != nil {
		return err
	}
	var attrs tkn20.Attributes
	attrs.FromMap(m)
	key, err := msk.KeyGen(rnd, attrs)
	if err != nil {
		return err
	}
	return writeFrom(*out, &key, 0o600)
}

// cmdEncrypt encrypts a file under a policy in CIRCL's grammar.
func cmdEncrypt(args []string) error {
	fs := newFlags("encrypt")
	pkPath := fs.String("pk", "", "public key `file`")
	policyArg := fs.String("policy", "", "access `policy`, e.g. 'country: US or region: EU'")
	in := fs.String("in", "", "plaintext `file`")
	out := fs.String("out", "", "ciphertext output `file`")
	seed := fs.String("seed", "", "`hex` seed for reproducible randomness")
	if err := parseFlags(fs, args, "pk", "policy", "in", "out"); err != nil {
		return err
	}
	rnd, err := randomness(*seed)
	if err != nil {
		return err
	}
	var policy tkn20.Policy
	if err := policy.FromString(*policyArg); err != nil {
		return fmt.Errorf("policy: %v", err)
	}
	var pk tkn20.PublicKey
	if err := readInto(*pkPath, "public key", &pk); err != nil {
		return err
	}
	msg, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	ct, err := pk.Encrypt(rnd, policy, msg)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, ct, 0o644)
}

// cmdDecrypt decrypts a ciphertext with an attribute key. The output file
// is written only on success.
func cmdDecrypt(args []string) error {
	fs := newFlags("decrypt")
	keyPath := fs.String("key", "", "attribute key `file`")
	in := fs.String("in", "", "ciphertext `file`")
	out := fs.String("out", "", "plaintext output `file`")
	if err := parseFlags(fs, args, "key", "in", "out"); err != nil {
		return err
	}
	var key tkn20.AttributeKey
	if err := readInto(*keyPath, "attribute key", &key); err != nil {
		return err
	}
	ct, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	pt, err := key.Decrypt(ct)
	if err != nil {
		return fmt.Errorf("decryption failed: %v", err)
	}
	return os.WriteFile(*out, pt, 0o600)
}

// cmdInspect prints the policy a ciphertext was made under, as CIRCL's
// Policy.String renders it (fully parenthesised, negation on the leaves).
func cmdInspect(args []string) error {
	fs := newFlags("inspect")
	in := fs.String("in", "", "ciphertext `file`")
	if err := parseFlags(fs, args, "in"); err != nil {
		return err
	}
	ct, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var policy tkn20.Policy
	if err := policy.ExtractFromCiphertext(ct); err != nil {
		return fmt.Errorf("reading the policy: %v", err)
	}
	fmt.Println(policy.String())
	return nil
}
