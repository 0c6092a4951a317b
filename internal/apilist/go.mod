module github.com/idem-go/idem/internal/apilist

go 1.26.0

require (
	golang.org/x/mod v0.43.0
	golang.org/x/tools v0.53.0
)

require golang.org/x/sync v0.25.0 // indirect
