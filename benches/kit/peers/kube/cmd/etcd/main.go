// Command etcd is the etcd server, built from its published module at the version go.mod
// pins, for the tests' real kube-apiserver to store its objects in.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
