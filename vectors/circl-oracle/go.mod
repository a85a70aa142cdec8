module keyfence.dev/vectors/circl-oracle

go 1.25.0

require github.com/cloudflare/circl v1.6.5

require (
	golang.org/x/crypto v0.54.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
