# One VPC, three AZs: nodes in private subnets, load balancers in public ones,
# PostgreSQL in isolated database subnets. One NAT gateway keeps the bill small;
# set single_nat_gateway = false for a NAT gateway per AZ.
module "vpc" {
  # checkov:skip=CKV_TF_1:Registry module pinned to a major version (a commit hash applies to git sources only); .terraform.lock.hcl pins providers.
  source  = "terraform-aws-modules/vpc/aws"
  version = "~> 6.0"

  name = var.cluster_name
  cidr = var.vpc_cidr
  azs  = local.azs

  private_subnets  = [for i, _ in local.azs : cidrsubnet(var.vpc_cidr, 4, i)]
  public_subnets   = [for i, _ in local.azs : cidrsubnet(var.vpc_cidr, 8, 48 + i)]
  database_subnets = [for i, _ in local.azs : cidrsubnet(var.vpc_cidr, 8, 52 + i)]

  create_database_subnet_group = true
  enable_nat_gateway           = true
  single_nat_gateway           = true

  public_subnet_tags  = { "kubernetes.io/role/elb" = 1 }
  private_subnet_tags = { "kubernetes.io/role/internal-elb" = 1 }
}
